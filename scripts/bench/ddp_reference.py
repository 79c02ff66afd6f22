#!/usr/bin/env python3
"""The PyTorch side of ddp_scaling.sh: DistributedDataParallel (gloo) over Hugging Face
BertForSequenceClassification, one process per rank started with torch.multiprocessing,
1 intra-op thread per rank. Prints mean ms/step (rank 0, after warm-up) as JSON."""
import argparse
import csv
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024)}


def load(a):
    with open(a.data, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    texts = [r[1].replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\") for r in rows]
    names = sorted({r[0] for r in rows})
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    enc = tok(texts, truncation=True, max_length=a.seq, padding="max_length", return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.tensor([names.index(r[0]) for r in rows]), tok.vocab_size


def worker(rank, a, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    ids, mask, labels, vocab = load(a)
    hidden, layers, heads, inter = PRESETS[a.preset]
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=inter, max_position_embeddings=a.seq, num_labels=a.labels)).train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=5e-4)
    times = []
    for step in range(a.steps):
        lo = ((step * a.ranks + rank) * a.batch) % (ids.size(0) - a.batch)
        start = time.perf_counter()
        loss = ddp(input_ids=ids[lo:lo + a.batch], attention_mask=mask[lo:lo + a.batch],
                   labels=labels[lo:lo + a.batch]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - start) * 1000)
    if rank == 0:
        steady = sorted(times[a.warmup:])
        out.put((sum(steady) / len(steady), steady[len(steady) // 2]))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, kind, default in (("data", str, None), ("vocab", str, None), ("preset", str, "tiny"),
                                ("batch", int, 32), ("seq", int, 64), ("steps", int, 40), ("warmup", int, 5),
                                ("ranks", int, 2), ("labels", int, None), ("port", int, 29533)):
        p.add_argument("--" + name, type=kind, default=default, required=default is None)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, out)) for r in range(a.ranks)]
    for proc in procs:
        proc.start()
    mean, median = out.get()
    for proc in procs:
        proc.join()
    print(json.dumps({"ms_per_step": mean, "median_ms_per_step": median}))


if __name__ == "__main__":
    main()
