#!/usr/bin/env python3
"""TorchScript: a module traced from HF BertForSequenceClassification by PyTorch loads
through torch::jit::load in C++; its logits and our eager model's on the same weights
equal HF's to within the rounding HF's own fp32 forward makes against the same model in
float64 (tests/harness/bounds.py); and it runs as a `torchscript` benchmark cell."""
import csv
import json
import os
import subprocess
import sys

import torch
from random_bert import save_random_bert

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402
from harness.e2e import LANGID  # noqa: E402


def test(args, work):
    vocab = sum(1 for _ in open(os.path.join(LANGID, "vocab.txt"), encoding="utf-8"))
    hf_dir = os.path.join(work, "hf")
    model = save_random_bert(hf_dir, vocab, 64, 4, 128, 0.15, torchscript=True)
    ids = torch.randint(5, vocab, (3, 24))
    mask = torch.ones_like(ids)
    ids[1, 15:] = 0
    mask[1, 15:] = 0
    traced = torch.jit.trace(model, (ids, mask))
    script = os.path.join(work, "bert_traced.pt")
    traced.save(script)
    with torch.no_grad():
        expected = model(ids, mask)[0]
        exact = in_float64(model)(ids, mask)[0]
    inputs = os.path.join(work, "inputs.json")
    json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, open(inputs, "w"))

    def probe(*cmd):
        out = subprocess.run([args.probe, *cmd], capture_output=True, text=True, check=True).stdout
        return torch.tensor(json.loads(out)["logits"])

    scripted = probe("torchscript", script, inputs)
    eager = probe("logits", hf_dir, inputs)
    close = True
    for name, candidate in (("torchscript", scripted), ("our eager", eager)):
        ok, detail = within_rounding_of(candidate, expected, exact)
        print(f"{name}: {detail}; max |logit diff| from HF {(candidate - expected).abs().max().item():.2e}")
        close &= ok

    job = os.path.join(work, "job.yaml")
    open(job, "w").write(f"""name: ts_bench
kind: benchmark
data:
  train: {LANGID}/train.tsv
  tokenizer: {{vocab: {LANGID}/vocab.txt}}
model: {{init: {hf_dir}}}
benchmark:
  batch_sizes: [1, 4]
  seq_lens: [16, 64]
  modes: [eager, torchscript]
  torchscript: {script}
  iters: 4
runtime: {{device: cpu, threads: 1}}
""")
    run = subprocess.run([args.worker, job, "--runs-dir", os.path.join(work, "runs")], capture_output=True, text=True)
    print(run.stdout[-2000:], run.stderr[-2000:])
    with open(os.path.join(work, "runs", "ts_bench", "benchmark.csv")) as f:
        cells = list(csv.DictReader(f))
    script_cells = [c for c in cells if c["mode"] == "torchscript"]
    ran = run.returncode == 0 and len(script_cells) == 4 and all(c["status"] == "ok" for c in script_cells)
    print(f"torchscript benchmark cells: {[(c['batch'], c['seq_len'], c['status'], c['mean_ms']) for c in script_cells]}")
    check(close and ran, f"logits within HF's rounding {close}; torchscript cells measured {ran} (the lines above)")


if __name__ == "__main__":
    run_test(test, ("--probe", "--worker"), __doc__)
