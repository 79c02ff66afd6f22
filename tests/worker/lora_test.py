#!/usr/bin/env python3
"""model.lora end to end. A BERT is fine-tuned on langid, then LoRA-tuned from it on 2
MPI ranks with merge: true. Checked: the training checkpoint holds only the adapters and
the classifier (the base is frozen and comes from model.init); peft's
PeftModel.from_pretrained loads our adapter folder onto the base, and its dev accuracy
equals the eval_acc we logged; the merged folder loads as a plain HF model with PEFT's
logits; the same job trains under bf16. A target that matches no layer is exit 2 naming model.lora.target_modules."""
import csv
import glob
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test, skip  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402
from harness.e2e import FULL_DEV, LANGID, MPI_ENV, job_yaml, subset_tsv, write  # noqa: E402
try:
    from peft import PeftModel
except ImportError:
    # A missing reference must not read as a pass: only a machine that cannot have peft
    # (the GPU box's bare python, scripts/gpu/build_and_test.sh) says so, and skips.
    if os.environ.get("TRAINYARD_TESTS_WITHOUT_PEFT") == "1":
        skip("the peft package is not installed (TRAINYARD_TESTS_WITHOUT_PEFT=1)")
    raise AssertionError("the peft package is not installed; scripts/setup.sh puts it in the venv "
                         "(TRAINYARD_TESTS_WITHOUT_PEFT=1 skips this test where it cannot be had)")
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForSequenceClassification, BertTokenizer  # noqa: E402


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, restore_signals=False, **kw)


def dev_accuracy(model):
    tokenizer = BertTokenizer(os.path.join(LANGID, "vocab.txt"), do_lower_case=True)
    labels = open(os.path.join(LANGID, "labels.txt")).read().split()
    with open(FULL_DEV, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    correct = 0
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            chunk = rows[start:start + 64]
            texts = [r[1].replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\") for r in chunk]
            batch = tokenizer(texts, truncation=True, max_length=64, padding=True, return_tensors="pt")
            predicted = model(**batch).logits.argmax(1)
            correct += sum(int(p) == labels.index(r[0]) for p, r in zip(predicted, chunk))
    return correct / len(rows)


def checkpoint_tensors(run_dir):
    newest = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.safetensors")))[-1]
    with safe_open(newest, "pt") as f:
        return [k[len("model."):] for k in f.keys() if k.startswith("model.")]


def test(args, work):
    ok = True
    train = subset_tsv(work, 3000)
    base_job = os.path.join(work, "base.yaml")
    write(base_job, job_yaml("base", train, "train: {epochs: 1, batch_size: 32, lr: 1.0e-3}\n"))
    check(run([args.worker, base_job, "--runs-dir", os.path.join(work, "runs")]).returncode == 0,
          "the base fine-tune failed")
    base = os.path.join(work, "runs", "base", "model")
    lora_job = os.path.join(work, "lora.yaml")
    # Evaluated on the whole dev set, as dev_accuracy() evaluates PEFT's model.
    write(lora_job, job_yaml("lora", train, f"""train: {{epochs: 1, batch_size: 16, lr: 5.0e-3}}
""", dev=FULL_DEV).replace("  preset: tiny\n", f"  init: {base}\n  lora: {{r: 8, alpha: 16, merge: true}}\n"))
    lora = run([args.mpirun, "-n", "2", "--oversubscribe", args.worker, lora_job, "--runs-dir",
                os.path.join(work, "runs")], env=MPI_ENV)
    print("\n".join(l for l in lora.stdout.splitlines() if "LoRA" in l or "trainable" in l))
    check(lora.returncode == 0, f"the LoRA job failed:\n{lora.stderr[-3000:]}")
    run_dir = os.path.join(work, "runs", "lora")
    with open(os.path.join(run_dir, "epochs.csv")) as f:
        logged = float(list(csv.DictReader(f))[-1]["eval_acc"])

    saved = checkpoint_tensors(run_dir)
    only_trained = saved and all(".lora_" in k or k.startswith("classifier.") for k in saved)
    print(f"checkpoint: {len(saved)} model tensors, only adapters and classifier: {bool(only_trained)}")
    ok &= bool(only_trained)

    peft = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base),
                                     os.path.join(run_dir, "adapter")).eval()
    accuracy = dev_accuracy(peft)
    agree = abs(accuracy - logged) < 2e-3
    print(f"PEFT on our adapter: dev accuracy {accuracy:.4f}, our eval_acc {logged:.4f} (agree: {agree})")
    ok &= agree

    merged = AutoModelForSequenceClassification.from_pretrained(os.path.join(run_dir, "model")).eval()
    ids = torch.randint(5, 1000, (3, 20))
    with torch.no_grad():
        unmerged, merged_logits = peft(input_ids=ids).logits, merged(input_ids=ids).logits
        diff = (merged_logits - unmerged).abs().max().item()
        # Merging rounds W + BA once per weight; the rest rounds as PEFT's fp32 forward
        # does: held against PEFT's in float64 (tests/harness/bounds.py).
        within, detail = within_rounding_of(merged_logits, unmerged, in_float64(peft)(input_ids=ids).logits)
    print(f"merged folder vs PEFT's unmerged logits: max |diff| {diff:.2e}; {detail}")
    ok &= within

    bf16 = os.path.join(work, "bf16.yaml")
    write(bf16, open(lora_job).read().replace("name: lora", "name: lora_bf16").replace(
        "train: {epochs: 1,", "train: {precision: bf16, epochs: 1,"))
    bf16_run = run([args.worker, bf16, "--runs-dir", os.path.join(work, "runs")])
    bf16_ok = bf16_run.returncode == 0
    if bf16_ok:
        with open(os.path.join(work, "runs", "lora_bf16", "epochs.csv")) as f:
            row = list(csv.DictReader(f))[-1]
        bf16_ok = float(row["eval_acc"]) > 0.5 and os.path.exists(
            os.path.join(work, "runs", "lora_bf16", "adapter", "adapter_model.safetensors"))
        print(f"bf16 LoRA run: dev accuracy {float(row['eval_acc']):.4f}, adapter written: {bf16_ok}")
    else:
        print(f"bf16 LoRA run failed: {bf16_run.stderr[-1500:]}")
    ok &= bf16_ok

    bad = os.path.join(work, "bad.yaml")
    write(bad, open(lora_job).read().replace("lora: {r: 8", "lora: {target_modules: [qkv], r: 8"))
    failed = run([args.worker, bad, "--runs-dir", os.path.join(work, "runs")])
    message = failed.stderr.strip().splitlines()[-1] if failed.stderr.strip() else ""
    good = failed.returncode == 2 and "model.lora.target_modules" in message and "query" in message
    print(f"{'ok  ' if good else 'FAIL'} unmatched target: exit {failed.returncode}: {message[:220]}")
    ok &= good
    check(ok, "LoRA's checkpoint, adapter, merged folder, bf16 run or refusal are not as they should be "
              "(the lines above)")


if __name__ == "__main__":
    run_test(test, ("--worker", "--mpirun"), __doc__)
