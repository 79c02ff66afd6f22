#!/usr/bin/env python3
"""tokenizer.json parity: the tokenizer a job gets from a model.init folder that holds only
a tokenizer.json (common/tokenizer_json.h, through tests/tools/tokenize_tool.cc) gives the
ids that Hugging Face's `tokenizers` library gives reading the same file, on >2,000 real
fortunes lines in several scripts plus bpe_parity's hand-made edge cases. The files are
written by transformers' save_pretrained: BERT WordPiece uncased and cased (the prepared
langid vocab.txt), RoBERTa byte-level BPE with and without add_prefix_space (langid's
vocab.json with <s> and </s>), and GPT-2 byte-level BPE (the lm vocabulary). Each BPE
file is read twice, with its merges as ["a", "b"] pairs (tokenizers 0.20 and later) and
rewritten as "a b" strings (earlier versions)."""
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer
from transformers import BertTokenizerFast, GPT2TokenizerFast, RobertaTokenizerFast

from bpe_parity import EDGE_LINES
from tokenizer_parity import corpus, escape

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402


def ours(tool, path, lines):
    run = subprocess.run([tool, "--tokenizer-json", path], input="".join(escape(l) + "\n" for l in lines),
                         capture_output=True, text=True)
    check(run.returncode == 0, run.stderr)
    rows = [[int(t) for t in row.split()] for row in run.stdout.splitlines()]
    check(len(rows) == len(lines), f"{len(rows)} outputs for {len(lines)} lines")
    return rows


def saved(tokenizer, folder):
    """The tokenizer.json save_pretrained writes for `tokenizer`, alone in `folder`."""
    tokenizer.save_pretrained(folder)
    for name in os.listdir(folder):
        if name != "tokenizer.json":
            os.remove(os.path.join(folder, name))
    return os.path.join(folder, "tokenizer.json")


def with_string_merges(path):
    """A copy of `path` whose merges are "a b" strings."""
    spec = json.load(open(path, encoding="utf-8"))
    merges = spec["model"]["merges"]
    check(merges and isinstance(merges[0], list), "save_pretrained wrote merges as pairs")
    spec["model"]["merges"] = [" ".join(pair) for pair in merges]
    out = path.replace(".json", ".strings.json")
    json.dump(spec, open(out, "w", encoding="utf-8"), ensure_ascii=False)
    return out


def compare(tool, path, lines, label):
    reference = Tokenizer.from_file(path)
    expected = [e.ids for e in reference.encode_batch(lines)]
    got = ours(tool, path, lines)
    bad = [(l, e, o) for l, e, o in zip(lines, expected, got) if e != o]
    print(f"{label}: {len(lines)} lines, {sum(map(len, expected))} ids, {len(bad)} mismatches")
    for line, e, o in bad[:3]:
        print(f"  MISMATCH {line!r}\n    hf:   {e}\n    ours: {o}")
    return len(bad)


def test(args, work):
    lines = corpus() + EDGE_LINES
    bpe = (os.path.join(args.langid, "bpe", "vocab.json"), os.path.join(args.langid, "bpe", "merges.txt"))
    lm = (os.path.join(args.lm, "bpe", "vocab.json"), os.path.join(args.lm, "bpe", "merges.txt"))
    cases = [
        ("bert uncased", BertTokenizerFast(vocab_file=os.path.join(args.langid, "vocab.txt"), do_lower_case=True)),
        ("bert cased", BertTokenizerFast(vocab_file=os.path.join(args.langid, "vocab.txt"), do_lower_case=False)),
        ("roberta", RobertaTokenizerFast(vocab_file=bpe[0], merges_file=bpe[1])),
        ("roberta add_prefix_space", RobertaTokenizerFast(vocab_file=bpe[0], merges_file=bpe[1], add_prefix_space=True)),
        ("gpt2", GPT2TokenizerFast(vocab_file=lm[0], merges_file=lm[1])),
    ]
    mismatches = 0
    for label, tokenizer in cases:
        path = saved(tokenizer, os.path.join(work, label.replace(" ", "_")))
        mismatches += compare(args.tokenize, path, lines, label)
        if "merges" in json.load(open(path, encoding="utf-8"))["model"]:
            mismatches += compare(args.tokenize, with_string_merges(path), lines, label + ", merges as strings")
    check(len(lines) >= 2000 and not mismatches, f"{len(lines)} lines (2,000 at least), {mismatches} mismatches")


def options(parser):
    parser.add_argument("--tokenize", required=True, help="the ty_tokenize binary")
    parser.add_argument("--langid", required=True, help="prepared langid folder (vocab.txt, bpe/)")
    parser.add_argument("--lm", required=True, help="prepared lm folder (bpe/)")


if __name__ == "__main__":
    run_test(test, (), __doc__, options)
