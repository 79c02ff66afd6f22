#!/usr/bin/env python3
"""Generation parity: greedy decoding from the same GPT-2 weights and prompts gives the
same token ids as Hugging Face's generate(do_sample=False), for 32 new tokens at batch 1
and at batch 4 with left padding, and with a stop token that ends rows early; our KV-cache
path equals our no-cache path, and the fixed-shape decode steps a CUDA graph captures equal
the growing ones; sampling is reproducible from its seed, and top_k=1 or a tiny top_p is
greedy."""
import json
import os
import subprocess
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402

VOCAB = 300
EOS = VOCAB - 1
NEW = 32


def make_model(folder):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64, bos_token_id=EOS,
                        eos_token_id=EOS)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # wider weights: varied, confident next tokens
        for name, p in model.named_parameters():
            if ".ln_" not in name and "ln_f" not in name:
                p.normal_(0.0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def prompts(count):
    g = torch.Generator().manual_seed(2)
    lengths = [9, 3, 14, 6][:count]
    return [torch.randint(3, VOCAB - 1, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model, rows, stop=EOS):
    width = max(map(len, rows))
    ids = torch.tensor([[EOS] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                             pad_token_id=EOS, eos_token_id=stop)
    return out[:, width:].tolist()


def ours(probe, folder, work, rows, **options):
    path = os.path.join(work, "generate.json")
    with open(path, "w") as f:
        json.dump({"prompts": rows, "max_new_tokens": NEW, "pad_id": EOS, "stop_ids": [EOS], **options}, f)
    out = subprocess.run([probe, "generate", folder, path], capture_output=True, text=True)
    check(out.returncode == 0, f"probe generate failed: {out.stderr.strip()}")
    return json.loads(out.stdout)["tokens"]


def same(name, got, expected):
    """Whether `got` equals `expected`, said in a line (and both shown when not)."""
    equal = got == expected
    print(f"{name}: {'equal' if equal else 'DIFFERENT'}")
    if not equal:
        print(f"  expected {expected}\n  got      {got}")
    return equal


def test(args, work):
    ok = True
    folder = os.path.join(work, "gpt2")
    model = make_model(folder)
    for batch in (1, 4):
        rows = prompts(batch)
        expected = hf_greedy(model, rows)
        cached = ours(args.probe, folder, work, rows)
        ok &= same(f"batch {batch}: greedy vs HF generate", cached, expected)
        ok &= same(f"batch {batch}: cache vs no cache", ours(args.probe, folder, work, rows, use_cache=False),
                   cached)
        ok &= same(f"batch {batch}: fixed-shape decode (a CUDA graph's) vs growing",
                   ours(args.probe, folder, work, rows, decode="fixed"), cached)
        print(f"  {sum(len(r) for r in expected)} tokens, first row {expected[0][:10]}...")
    rows = prompts(4)
    greedy = ours(args.probe, folder, work, rows)
    stop = greedy[0][2]  # a token row 0 emits third: rows stop early, at different steps
    stopped = ours(args.probe, folder, work, rows, stop_ids=[stop])
    ok &= same(f"batch 4, stop token {stop}: vs HF generate", stopped, hf_greedy(model, rows, stop))
    ok &= same(f"batch 4, stop token {stop}: fixed-shape decode", ours(args.probe, folder, work, rows,
                                                                       stop_ids=[stop], decode="fixed"), stopped)
    ended = stopped[0][2] == stop and set(stopped[0][3:]) <= {EOS}
    print(f"  row 0 ends at its stop token, padded after: {ended}")
    ok &= ended
    sampled = [ours(args.probe, folder, work, rows, sample=True, temperature=1.3, top_k=50, top_p=0.95, seed=s)
               for s in (7, 7, 8)]
    ok &= same("sampling: the same seed gives the same tokens", sampled[0], sampled[1])
    differs = sampled[0] != sampled[2] and sampled[0] != greedy
    print(f"sampling: another seed / greedy differ: {differs}")
    ok &= differs
    ok &= same("sampling with top_k=1 is greedy", ours(args.probe, folder, work, rows, sample=True, top_k=1, seed=3),
               greedy)
    ok &= same("sampling with top_p=1e-6 is greedy",
               ours(args.probe, folder, work, rows, sample=True, top_p=1e-6, seed=3), greedy)
    check(ok, "generations differ (the DIFFERENT lines above), or a row did not stop, or seeds did not tell")


if __name__ == "__main__":
    run_test(test, ("--probe",), __doc__)
