#!/usr/bin/env python3
"""The PyTorch side of train_step_vs_pytorch.sh: a plain training loop over Hugging Face
BertForSequenceClassification with the same preset, batch, length, data, optimizer,
clipping and thread count as the worker's job. Prints the mean and median ms/step over
the steps after warm-up, and the model's non-embedding parameter count (for MFU).

On CUDA each step is timed with CUDA events recorded around it, read once at the end,
as the worker times its steps; --precision bf16/fp16 runs under autocast (fp16 with
torch.amp.GradScaler), --tf32 allows TF32 matrix products, --compile wraps the model
in torch.compile, in --compile-mode (compilation happens in the warm-up steps, which are
not timed).
--init loads the model from an HF folder instead of a fresh preset, and --lora-r R wraps
it in PEFT's LoRA (r = alpha = R on query and value, the classifier trained in full, as
the worker's model.lora does), so only the adapters are optimised and clipped."""
import argparse
import csv
import json
import statistics
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def build(a, vocab_size):
    hidden, layers, heads, inter = PRESETS[a.preset]
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=a.seq,
                        num_labels=a.labels)
    return BertForSequenceClassification(config).to(a.device).train()


def non_embedding_params(model):
    return sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)


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
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default="default", help="torch.compile's mode (reduce-overhead: CUDA graphs)")
    p.add_argument("--init", default="")
    p.add_argument("--lora-r", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(0)
    with open(a.data, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    texts = [r[1].replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\") for r in rows]
    label_names = sorted({r[0] for r in rows})
    labels = torch.tensor([label_names.index(r[0]) for r in rows]).to(a.device)
    tok = BertTokenizer(a.vocab, do_lower_case=True)
    enc = tok(texts, truncation=True, max_length=a.seq, padding="max_length", return_tensors="pt")
    ids, mask = enc["input_ids"].to(a.device), enc["attention_mask"].to(a.device)
    model = (BertForSequenceClassification.from_pretrained(a.init).to(a.device).train() if a.init
             else build(a, tok.vocab_size))
    if a.lora_r:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=a.lora_r, lora_alpha=a.lora_r,
                                                 target_modules=["query", "value"])).train()
    forward = torch.compile(model, mode=a.compile_mode) if a.compile else model
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=5e-4)
    dtype = DTYPES[a.precision]
    scaler = torch.amp.GradScaler(a.device, enabled=a.precision == "fp16")
    cuda = a.device == "cuda"
    events = []
    times = []
    n = ids.size(0)
    for step in range(a.steps):
        lo = (step * a.batch) % (n - a.batch)
        start = time.perf_counter()
        if cuda:
            events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            events[-1][0].record()
        with torch.autocast(a.device, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = forward(input_ids=ids[lo:lo + a.batch], attention_mask=mask[lo:lo + a.batch],
                          labels=labels[lo:lo + a.batch])
        scaler.scale(out.loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if cuda:
            events[-1][1].record()
        else:
            times.append((time.perf_counter() - start) * 1000)
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
    steady = times[a.warmup:]
    print(json.dumps({"ms_per_step": sum(steady) / len(steady), "median_ms": statistics.median(steady),
                      "steps": len(steady), "non_embedding_params": non_embedding_params(model)}))


if __name__ == "__main__":
    main()
