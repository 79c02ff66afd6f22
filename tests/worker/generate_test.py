#!/usr/bin/env python3
"""kind: generate end to end: the worker continues real fortunes prompts with a GPT-2 that
Hugging Face saved, through our byte-level BPE and KV cache, and its tokens and text
equal HF's GPT2TokenizerFast + generate(do_sample=False) on the same prompts, with left
padding across batches; the same job runs under bf16, and from a model folder whose only
tokenizer file is HF's tokenizer.json with a job that names no tokenizer. Bad input exits 2 with the file, line and field at fault."""
import json
import os
import re
import shutil
import subprocess
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SOURCE_DIR, check, run_test  # noqa: E402
from harness.e2e import write  # noqa: E402

LM = os.path.join(SOURCE_DIR, "data", "prepared", "lm")
VOCAB, MERGES = os.path.join(LM, "bpe", "vocab.json"), os.path.join(LM, "bpe", "merges.txt")
NEW = 16


def make_model(folder, tokenizer):
    torch.manual_seed(0)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=64,
                        bos_token_id=eos, eos_token_id=eos)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" not in name and "ln_f" not in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model, eos


def prompts():
    with open(os.path.join(LM, "dev.txt"), encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip()][:7]
    return [" ".join(l.replace("\\n", " ").replace("\\t", " ").split()[: 2 + 2 * i]) for i, l in enumerate(lines)]


def job(work, model_dir, prompts_file, extra="", name_tokenizer=True):
    """The generate job; without `name_tokenizer` it takes model.init's own."""
    tokenizer = f"""data:
  tokenizer:
    kind: bpe
    vocab: {VOCAB}
    merges: {MERGES}
""" if name_tokenizer else ""
    return f"""name: gen
kind: generate
{tokenizer}model:
  init: {model_dir}
generate:
  prompts: {prompts_file}
  batch_size: 3
  max_new_tokens: {NEW}
{extra}runtime:
  device: cpu
  threads: 1
log:
  runs_dir: {os.path.join(work, "runs")}
"""


def run_worker(worker, path):
    return subprocess.run([worker, path], capture_output=True, text=True, timeout=300)


def hf_generate(model, tokenizer, texts, eos):
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.padding_side = "left"
    rows = []
    for start in range(0, len(texts), 3):  # the job's batches: the same left padding
        batch = tokenizer(texts[start:start + 3], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, do_sample=False, max_new_tokens=NEW, pad_token_id=eos, eos_token_id=eos)
        width = batch["input_ids"].shape[1]
        rows += out[:, width:].tolist()
    return rows


def check_generations(worker, work, model, tokenizer, eos, model_dir, name_tokenizer=True):
    texts = prompts()
    prompts_file = os.path.join(work, "prompts.txt")
    write(prompts_file, "\n".join(texts) + "\n")
    path = os.path.join(work, "gen.yaml")
    write(path, job(work, model_dir, prompts_file, name_tokenizer=name_tokenizer))
    run = run_worker(worker, path)
    if run.returncode != 0:
        print(run.stderr[-3000:])
        return False
    with open(os.path.join(work, "runs", "gen", "generations.jsonl"), encoding="utf-8") as f:
        ours = [json.loads(l) for l in f]
    expected = hf_generate(model, tokenizer, texts, eos)
    ok = len(ours) == len(texts)
    for row, (mine, theirs) in enumerate(zip(ours, expected)):
        theirs = theirs + [eos] * (len(mine["tokens"]) - len(theirs))
        cut = theirs.index(eos) if eos in theirs else len(theirs)
        same = mine["tokens"][: len(theirs)] == theirs[: len(mine["tokens"])] and \
            mine["completion"] == tokenizer.decode(theirs[:cut]) and mine["prompt"] == texts[row]
        print(f"prompt {row} ({len(tokenizer(texts[row])['input_ids'])} tokens): {'equal' if same else 'DIFFERENT'}"
              f" -> {mine['completion'][:50]!r}")
        if not same:
            print(f"  hf:   {theirs}\n  ours: {mine['tokens']}")
        ok &= same
    summary = [l for l in (run.stdout + run.stderr).splitlines() if "time to first token" in l]
    print(summary[-1] if summary else "no summary line")
    # 7 prompts in batches of 3: a line per batch with the elapsed time and the time left
    batches = re.findall(r"generate: prompts (\d+)-(\d+) of 7 \[\d+:\d\d<(\d+:\d\d|\?)\]", run.stdout + run.stderr)
    clocked = [(int(a), int(b)) for a, b, _ in batches] == [(1, 3), (4, 6), (7, 7)] and batches[-1][2] == "0:00"
    print(f"per-batch lines with a clock: {clocked} {batches}")
    return ok and bool(summary) and clocked


def check_tokenizer_json(worker, work, model, tokenizer, eos, model_dir):
    """A model folder whose only tokenizer file is the tokenizer.json HF saved, and a job
    that names none: the same generations."""
    folder = os.path.join(work, "gpt2_tokenizer_json")
    shutil.copytree(model_dir, folder)
    tokenizer.save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        os.remove(os.path.join(folder, name))
    print("model.init folder with tokenizer.json alone, job without data.tokenizer:")
    return check_generations(worker, work, model, tokenizer, eos, folder, name_tokenizer=False)


def check_bf16(worker, work, model_dir, vocab_size):
    """Under bf16 autocast (the KV cache in bf16) every prompt still gets its tokens."""
    path = os.path.join(work, "gen_bf16.yaml")
    write(path, job(work, model_dir, os.path.join(work, "prompts.txt")).replace("name: gen\n", "name: gen_bf16\n")
          .replace("runtime:", "train:\n  precision: bf16\nruntime:"))
    run = run_worker(worker, path)
    rows = []
    if run.returncode == 0:
        with open(os.path.join(work, "runs", "gen_bf16", "generations.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(l) for l in f]
    good = len(rows) == len(prompts()) and all(r["tokens"] and all(0 <= t < vocab_size for t in r["tokens"]) for r in rows)
    print(f"{'ok  ' if good else 'FAIL'} bf16: {len(rows)} prompts continued, e.g. {rows[0]['completion'][:40]!r}"
          if rows else f"FAIL bf16: exit {run.returncode}: {run.stderr[-500:]}")
    return good


def check_bad_input(worker, work, model_dir):
    ok = True
    long_prompt = os.path.join(work, "long.txt")
    write(long_prompt, "short prompt\n" + " ".join(["word"] * 60) + "\n")
    unknown = os.path.join(work, "unknown_family")
    os.makedirs(unknown)
    for name in ("model.safetensors",):
        os.symlink(os.path.join(model_dir, name), os.path.join(unknown, name))
    config = json.load(open(os.path.join(model_dir, "config.json")))
    config["model_type"] = "xlnet"
    write(os.path.join(unknown, "config.json"), json.dumps(config))
    no_merges = os.path.join(work, "no_merges.yaml")
    cases = [
        ("a prompt longer than the positions", job(work, model_dir, long_prompt),
         ["generate.prompts", "line 2", "exceeds the model's 64 positions"]),
        ("a config.json of an unknown family", job(work, unknown, long_prompt),
         ["model.init", "config.json", "model_type", "xlnet"]),
        ("a stop string of two tokens",
         job(work, model_dir, os.path.join(work, "prompts.txt"), "  stop: ['hello world']\n"),
         ["generate.stop", "must be one"]),
        ("cuda_graph on a CPU job",
         job(work, model_dir, os.path.join(work, "prompts.txt"), "  cuda_graph: true\n"),
         ["generate.cuda_graph", "needs a CUDA device"]),
        ("a classifier for kind: generate", job(work, model_dir, long_prompt).replace(
            "kind: generate", "kind: generate\ntask: classification"), ["task", "causal_lm"]),
    ]
    for label, text, needles in cases:
        write(no_merges, text)
        run = run_worker(worker, no_merges)
        message = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        good = run.returncode == 2 and all(n in message for n in needles)
        print(f"{'ok  ' if good else 'FAIL'} {label}: exit {run.returncode}: {message[:200]}")
        ok &= good
    return ok


def test(args, work):
    tokenizer = GPT2TokenizerFast(vocab_file=VOCAB, merges_file=MERGES)
    model_dir = os.path.join(work, "gpt2")
    model, eos = make_model(model_dir, tokenizer)
    ok = check_generations(args.worker, work, model, tokenizer, eos, model_dir)
    ok &= check_tokenizer_json(args.worker, work, model, tokenizer, eos, model_dir)
    ok &= check_bf16(args.worker, work, model_dir, len(tokenizer))
    ok &= check_bad_input(args.worker, work, model_dir)
    check(ok, "generations differ from HF's, or a bad input was not refused as it should be (the lines above)")


if __name__ == "__main__":
    run_test(test, description=__doc__)
