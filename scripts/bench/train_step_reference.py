#!/usr/bin/env python3
"""The PyTorch side of train_step_vs_pytorch.sh: a plain training loop over Hugging Face
BertForSequenceClassification with the same preset, batch, length, data, optimizer and
thread count as the worker's job. Prints mean ms/step over the steps after warm-up."""
import argparse
import csv
import json
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--labels", type=int, required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(a.data, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    texts = [r[1].replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\") for r in rows]
    label_names = sorted({r[0] for r in rows})
    labels = torch.tensor([label_names.index(r[0]) for r in rows])
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    enc = tok(texts, truncation=True, max_length=a.seq, padding="max_length", return_tensors="pt")
    hidden, layers, heads, inter = PRESETS[a.preset]
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=a.seq,
                        num_labels=a.labels)
    model = BertForSequenceClassification(config).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=5e-4)
    times = []
    n = enc["input_ids"].size(0)
    for step in range(a.steps):
        lo = (step * a.batch) % (n - a.batch)
        start = time.perf_counter()
        out = model(input_ids=enc["input_ids"][lo:lo + a.batch], attention_mask=enc["attention_mask"][lo:lo + a.batch],
                    labels=labels[lo:lo + a.batch])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - start) * 1000)
    steady = times[a.warmup:]
    print(json.dumps({"ms_per_step": sum(steady) / len(steady), "steps": len(steady)}))


if __name__ == "__main__":
    main()
