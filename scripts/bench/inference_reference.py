#!/usr/bin/env python3
"""The PyTorch side of inference_vs_pytorch.sh. `prepare` makes the shared weights (an
HF folder) and a traced TorchScript file; `time` measures HF BertForSequenceClassification
eager on exactly the inputs the worker builds (the same token stream, cut the same way)."""
import argparse
import csv
import json
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}


def prepare(a):
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    hidden, layers, heads, inter = PRESETS[a.preset]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=inter, num_labels=9, torchscript=True)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    ids = torch.randint(5, tok.vocab_size, (2, 16))
    torch.jit.trace(model, (ids, torch.ones_like(ids))).save(a.out + "/traced.pt")


def token_stream(a, tok):
    """The worker's benchmark inputs: texts of data.train tokenized in file order,
    [CLS]/[SEP] dropped, concatenated up to 200,000 tokens."""
    stream = []
    with open(a.data, encoding="utf-8") as f:
        for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]:
            text = row[1].replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")
            stream += tok(text, add_special_tokens=False)["input_ids"]
            if len(stream) >= 200000:
                break
    return stream


def inputs(stream, cls, sep, batch, seq):
    body = max(0, seq - 2)
    span = len(stream) - body
    ids = torch.empty(batch, seq, dtype=torch.long)
    for r in range(batch):
        offset = (r * 7919 * max(body, 1)) % max(span, 1)
        ids[r] = torch.tensor([cls] + stream[offset:offset + body] + [sep])
    return ids


def time_cells(a):
    torch.set_num_threads(a.threads)
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    model = BertForSequenceClassification.from_pretrained(a.model).eval()
    stream = token_stream(a, tok)
    results = {}
    with torch.no_grad():
        for batch in a.batches:
            for seq in a.seqs:
                ids = inputs(stream, tok.cls_token_id, tok.sep_token_id, batch, seq)
                mask = torch.ones_like(ids)
                for _ in range(a.warmup):
                    model(input_ids=ids, attention_mask=mask)
                ms = []
                for _ in range(a.iters):
                    start = time.perf_counter()
                    model(input_ids=ids, attention_mask=mask)
                    ms.append((time.perf_counter() - start) * 1000)
                results[f"{batch}x{seq}"] = sum(ms) / len(ms)
    print(json.dumps(results))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["prepare", "time"])
    p.add_argument("--vocab", required=True)
    p.add_argument("--data")
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--preset", default="mini")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--seqs", type=int, nargs="+", default=[32, 128])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    prepare(a) if a.command == "prepare" else time_cells(a)


if __name__ == "__main__":
    main()
