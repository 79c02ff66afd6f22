#!/usr/bin/env python3
"""The Hugging Face side of generate_vs_hf.sh. `prepare` makes the shared weights (a
GPT2LMHeadModel folder, GPT-2-small shaped over the lm/ BPE vocabulary) and the prompts
file; `time` measures transformers' generate() (greedy, KV cache, every row generating
max_new_tokens) on the same prompts and batches, on --device under --precision's
autocast, and prints JSON: per batch size, the time to first token (a generate of 1
token) and decoding tokens/s (the rest), medians."""
import argparse
import json
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

SHAPES = {"small": (768, 12, 12), "mini": (256, 4, 4), "tiny": (128, 2, 2)}


def prepare(a):
    tok = GPT2TokenizerFast(vocab_file=a.vocab, merges_file=a.merges)
    embd, layers, heads = SHAPES[a.shape]
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_embd=embd, n_layer=layers, n_head=heads, n_positions=1024,
                        bos_token_id=eos, eos_token_id=eos)
    GPT2LMHeadModel(config).save_pretrained(a.out, safe_serialization=True)
    with open(a.dev, encoding="utf-8") as f:
        texts = [l.rstrip("\n").replace("\\n", " ").replace("\\t", " ") for l in f if len(l) > 80]
    prompts = []
    for text in texts:  # prompts of exactly a.prompt_tokens tokens
        ids = tok(text)["input_ids"]
        if len(ids) >= a.prompt_tokens:
            prompts.append(tok.decode(ids[:a.prompt_tokens]))
        if len(prompts) == a.count:
            break
    with open(a.prompts, "w", encoding="utf-8") as f:
        f.write("".join(p.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") + "\n" for p in prompts))


def unescape(line):
    return line.rstrip("\n").replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")


AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def timed_generate(model, batch, new_tokens, dtype=None):
    device = model.device
    start = time.perf_counter()
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        model.generate(**batch, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       pad_token_id=model.config.eos_token_id)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_batches(a):
    torch.set_num_threads(a.threads)
    tok = GPT2TokenizerFast(vocab_file=a.vocab, merges_file=a.merges)
    tok.pad_token, tok.padding_side = "<|endoftext|>", "left"
    model = GPT2LMHeadModel.from_pretrained(a.model).eval().to(a.device)
    dtype = AUTOCAST[a.precision]
    with open(a.prompts, encoding="utf-8") as f:
        prompts = [unescape(l) for l in f]
    out = {}
    for size in a.batches:
        batch = tok(prompts[:size], return_tensors="pt", padding=True).to(a.device)
        timed_generate(model, batch, 4, dtype)  # warm-up
        firsts, decodes = [], []
        for _ in range(a.repeats):
            first = timed_generate(model, batch, 1, dtype)
            full = timed_generate(model, batch, a.new_tokens, dtype)
            firsts.append(first * 1000)
            decodes.append(size * (a.new_tokens - 1) / max(1e-9, full - first))
        out[str(size)] = {"first_token_ms": statistics.median(firsts), "tokens_per_s": statistics.median(decodes)}
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    for flag in ("--vocab", "--merges", "--out", "--dev", "--prompts"):
        p.add_argument(flag, required=True)
    p.add_argument("--shape", default="small", choices=SHAPES)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--count", type=int, default=8)
    t = sub.add_parser("time")
    for flag in ("--vocab", "--merges", "--model", "--prompts"):
        t.add_argument(flag, required=True)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    t.add_argument("--new-tokens", type=int, default=64)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--device", default="cpu")
    t.add_argument("--precision", default="fp32", choices=AUTOCAST, help="autocast dtype (fp32: none)")
    a = parser.parse_args()
    prepare(a) if a.command == "prepare" else time_batches(a)


if __name__ == "__main__":
    main()
