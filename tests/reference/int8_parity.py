#!/usr/bin/env python3
"""Dynamic int8 quantization (`int8` mode) against PyTorch's own.

  parity    a BERT saved from HF, its Linear layers quantized by us (ty_probe logits
            --mode int8) and by torch.ao.quantization.quantize_dynamic on the HF model:
            the two int8 models agree far more closely than either agrees with fp32
            (both use the same qint8 weights and the same ATen kernel; they differ only
            where fp32 rounding elsewhere moves an activation across a quantization step)
  accuracy  langid tiny fine-tuned for one epoch of 9,000 examples, then two inference
            jobs over the dev set, eager and `inference.mode: int8`: the int8 accuracy
            is within 1 point of fp32's and at least 97% of the predictions are the
            same; and a benchmark job times an int8 cell beside the eager one (a bf16
            int8 cell is N/A)
"""
import csv
import json
import os
import subprocess
import sys

import torch
from random_bert import save_random_bert
from transformers import BertTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402
from harness.e2e import LANGID  # noqa: E402


def dev_texts(count):
    with open(os.path.join(LANGID, "dev.tsv"), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:count + 1]
    return [r[1].replace("\\n", "\n").replace("\\t", "\t") for r in rows]


def parity(args, work):
    tokenizer = BertTokenizerFast(os.path.join(LANGID, "vocab.txt"), do_lower_case=True)
    hf_dir = os.path.join(work, "hf")
    model = save_random_bert(hf_dir, len(tokenizer.vocab), 128, 2, 512, 0.1)
    enc = tokenizer(dev_texts(48), truncation=True, max_length=64, padding=True, return_tensors="pt")
    inputs = os.path.join(work, "inputs.json")
    json.dump({"input_ids": enc["input_ids"].tolist(), "attention_mask": enc["attention_mask"].tolist()},
              open(inputs, "w"))

    def probe(*extra):
        out = subprocess.run([args.probe, "logits", hf_dir, inputs, *extra], capture_output=True, text=True,
                             check=True).stdout
        return torch.tensor(json.loads(out)["logits"])

    with torch.no_grad():
        hf_fp32 = model(enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        exact = in_float64(model)(enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        hf_int8 = quantized(enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    ours_fp32, ours_int8 = probe(), probe("--mode", "int8")
    d_int8 = (ours_int8 - hf_int8).abs().max().item()
    d_quant = (hf_int8 - hf_fp32).abs().max().item()
    d_fp32 = (ours_fp32 - hf_fp32).abs().max().item()
    fp32_close, fp32_detail = within_rounding_of(ours_fp32, hf_fp32, exact)
    print(f"parity: |ours int8 - torch int8| {d_int8:.2e}, |torch int8 - fp32| {d_quant:.2e}, "
          f"|ours fp32 - HF fp32| {d_fp32:.2e} (logit scale {hf_fp32.abs().max().item():.2f}); "
          f"ours fp32: {fp32_detail}")
    check(fp32_close and d_quant > 1e-3 and d_int8 < 0.1 * d_quant,
          "our int8 logits are not far closer to torch's int8 than int8 is to fp32, or our fp32 logits are off "
          "HF's (the line above)")


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    check(proc.returncode == 0, f"failed: {' '.join(cmd)}")
    return proc.stdout + proc.stderr


# The examples the accuracy case trains on: the first half of langid's training split,
# one epoch, enough for a tiny model to pass 0.9 dev accuracy.
TRAIN_EXAMPLES = 9000


def accuracy(args, work):
    runs = os.path.join(work, "runs")
    train = os.path.join(work, "train.tsv")
    with open(os.path.join(LANGID, "train.tsv"), encoding="utf-8") as src, open(train, "w", encoding="utf-8") as dst:
        dst.writelines(line for _, line in zip(range(TRAIN_EXAMPLES + 1), src))
    common = f"""data:
  train: {train}
  labels: {LANGID}/labels.txt
  max_seq_len: 64
  tokenizer: {{vocab: {LANGID}/vocab.txt}}
runtime: {{device: cpu, threads: 1}}
log: {{progress: false}}
"""
    with open(os.path.join(work, "train.yaml"), "w") as f:
        f.write(f"name: int8_train\n{common}model: {{preset: tiny}}\ntrain: {{epochs: 1, batch_size: 32, lr: 1.0e-3}}\n")
    run([args.worker, os.path.join(work, "train.yaml"), "--runs-dir", runs, "--resume", "none"])
    model_dir = os.path.join(runs, "int8_train", "model")
    predictions = {}
    for mode in ("eager", "int8"):
        with open(os.path.join(work, f"{mode}.yaml"), "w") as f:
            f.write(f"name: int8_{mode}\nkind: inference\n{common}model: {{init: {model_dir}}}\n"
                    f"inference: {{input: {LANGID}/dev.tsv, mode: {mode}}}\n")
        log = run([args.worker, os.path.join(work, f"{mode}.yaml"), "--runs-dir", runs])
        with open(os.path.join(runs, f"int8_{mode}", "predictions.tsv"), encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        predictions[mode] = rows
        check(mode != "int8" or "Linear layers quantized" in log, "the int8 job did not say what it quantized")
    gold = [r["gold"] for r in predictions["eager"]]
    acc = {m: sum(r["predicted"] == g for r, g in zip(rows, gold)) / len(gold) for m, rows in predictions.items()}
    same = sum(a["predicted"] == b["predicted"] for a, b in zip(predictions["eager"], predictions["int8"])) / len(gold)
    print(f"accuracy on langid dev ({len(gold)} texts): fp32 {acc['eager']:.4f}, int8 {acc['int8']:.4f}, "
          f"same prediction {same:.4f}")
    with open(os.path.join(work, "bench.yaml"), "w") as f:
        f.write(f"name: int8_bench\nkind: benchmark\n{common}model: {{init: {model_dir}}}\n"
                "benchmark: {batch_sizes: [4], seq_lens: [64], precisions: [fp32, bf16], modes: [eager, int8], "
                "warmup: 1, iters: 3}\n")
    run([args.worker, os.path.join(work, "bench.yaml"), "--runs-dir", runs])
    with open(os.path.join(runs, "int8_bench", "benchmark.csv"), encoding="utf-8") as f:
        cells = list(csv.DictReader(f))
    by = {(c["mode"], c["precision"]): c for c in cells}
    print("benchmark cells:", {f"{m}/{p}": (c["status"], c["p50_ms"]) for (m, p), c in by.items()})
    cells_ok = (by[("int8", "fp32")]["status"] == "ok" and by[("int8", "bf16")]["status"] == "N/A" and
                by[("eager", "fp32")]["status"] == "ok")
    check(acc["eager"] > 0.9 and acc["eager"] - acc["int8"] <= 0.01 and same >= 0.97 and cells_ok,
          "int8's accuracy or agreement falls short of fp32's, or a benchmark cell is wrong (the lines above)")


CASES = {"parity": parity, "accuracy": accuracy}


if __name__ == "__main__":
    # The case is an option here (--case), as tests/CMakeLists.txt passes it.
    run_test(lambda args, work: CASES[args.case](args, work), ("--probe", "--worker"), __doc__.split("\n")[0],
             options=lambda p: p.add_argument("--case", choices=sorted(CASES), required=True))
