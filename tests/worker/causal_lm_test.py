#!/usr/bin/env python3
"""task: causal_lm end to end: a tiny GPT-2 fine-tuned on English fortunes through the
worker (byte-level BPE, length-bucketed batches, loss masked on padding). Dev perplexity
falls epoch over epoch; Hugging Face loads the saved model and its mean next-token loss
over the same dev texts equals the eval_loss we logged; and a generate job runs from it."""
import csv
import json
import math
import os
import subprocess
import sys

import torch
from transformers import GPT2LMHeadModel, GPT2TokenizerFast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SOURCE_DIR, check, run_test  # noqa: E402
from harness.e2e import write  # noqa: E402

LM = os.path.join(SOURCE_DIR, "data", "prepared", "lm")
VOCAB, MERGES = os.path.join(LM, "bpe", "vocab.json"), os.path.join(LM, "bpe", "merges.txt")
MAX_LEN = 48


def subset(src, dst, count):
    with open(src, encoding="utf-8") as f:
        lines = [l for l in f if l.strip()][:count]
    write(dst, "".join(lines))
    return [l.rstrip("\n").replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\") for l in lines]


def finetune_yaml(work, train, dev):
    return f"""name: lm
task: causal_lm
seed: 3
data:
  train: {train}
  dev: {dev}
  max_seq_len: {MAX_LEN}
  loader_threads: 1
  tokenizer: {{kind: bpe, vocab: {VOCAB}, merges: {MERGES}}}
model:
  family: gpt2
  preset: tiny
  dropout: 0.0
train:
  epochs: 3
  batch_size: 16
  lr: 2.0e-3
runtime:
  device: cpu
  threads: 2
log:
  runs_dir: {os.path.join(work, "runs")}
  progress: false
"""


def hf_dev_loss(model_dir, texts):
    """Mean next-token loss over every dev text, each alone (no padding), cut as we cut."""
    tokenizer = GPT2TokenizerFast(vocab_file=VOCAB, merges_file=MERGES)
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text)["input_ids"][:MAX_LEN]
            if len(ids) < 2:
                continue
            logits = model(torch.tensor([ids])).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item()
            count += len(ids) - 1
    return total / count


def test(args, work):
    train = os.path.join(work, "train.txt")
    dev = os.path.join(work, "dev.txt")
    subset(os.path.join(LM, "train.txt"), train, 750)
    dev_texts = subset(os.path.join(LM, "dev.txt"), dev, 250)
    job = os.path.join(work, "lm.yaml")
    write(job, finetune_yaml(work, train, dev))
    run = subprocess.run([args.worker, job], capture_output=True, text=True, timeout=900)
    print(run.stdout[-2500:])
    check(run.returncode == 0, f"finetune failed:\n{run.stderr[-3000:]}")
    with open(os.path.join(work, "runs", "lm", "epochs.csv")) as f:
        losses = [float(row["eval_loss"]) for row in csv.DictReader(f)]
    perplexities = [math.exp(l) for l in losses]
    falling = all(b < a for a, b in zip(perplexities, perplexities[1:]))
    print(f"dev perplexity by epoch: {[round(p, 1) for p in perplexities]} (falling: {falling})")

    model_dir = os.path.join(work, "runs", "lm", "model")
    hf_loss = hf_dev_loss(model_dir, dev_texts)
    agree = abs(hf_loss - losses[-1]) < 1e-3 * max(1.0, hf_loss)
    print(f"HF's dev loss on our saved model {hf_loss:.5f}, ours {losses[-1]:.5f} (agree: {agree})")

    prompts = os.path.join(work, "prompts.txt")
    write(prompts, "Time is\nThe computer\n")
    gen = os.path.join(work, "gen.yaml")
    write(gen, f"""name: lm_generate
kind: generate
data:
  tokenizer: {{kind: bpe, vocab: {VOCAB}, merges: {MERGES}}}
model:
  init: {model_dir}
generate: {{prompts: {prompts}, max_new_tokens: 12, batch_size: 2}}
runtime: {{device: cpu, threads: 1}}
log: {{runs_dir: {os.path.join(work, "runs")}}}
""")
    gen_run = subprocess.run([args.worker, gen], capture_output=True, text=True, timeout=300)
    generated = []
    if gen_run.returncode == 0:
        with open(os.path.join(work, "runs", "lm_generate", "generations.jsonl")) as f:
            generated = [json.loads(l) for l in f]
    for g in generated:
        print(f"generate: {g['prompt']!r} -> {g['completion']!r}")
    ok_generate = gen_run.returncode == 0 and len(generated) == 2 and all(g["tokens"] for g in generated)
    if not ok_generate:
        print(gen_run.stderr[-2000:])
    check(falling and agree and ok_generate and len(losses) == 3,
          f"{len(losses)} epochs (3 wanted), perplexity falling {falling}, HF's loss agrees {agree}, "
          f"generated {ok_generate}")


if __name__ == "__main__":
    run_test(test, description=__doc__)
