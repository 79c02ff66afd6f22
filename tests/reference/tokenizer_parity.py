#!/usr/bin/env python3
"""WordPiece parity: our tokenizer's ids equal Hugging Face BertTokenizer's on real
fortunes text (accented, Cyrillic, CJK, punctuation, long words), same vocab.txt."""
import glob
import os
import subprocess
import sys

from transformers import BertTokenizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"


def fortune_lines(path, limit):
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    lines = [l for l in text.split("\n") if l.strip() and l.strip() != "%"]
    return lines[:limit]


def corpus():
    lines = []
    for sub in ("de", "it", "es", "pl", "ru", "cs", "eo"):
        for path in sorted(glob.glob(os.path.join(FORTUNES, sub, "*")))[:3]:
            if not path.endswith((".dat", ".u8")):
                lines += fortune_lines(path, 150)
    for name in ("brasil", "chinese", "tang300", "song100", "computers", "linux", "perl", "science"):
        lines += fortune_lines(os.path.join(FORTUNES, name), 150)
    # Long words: URLs, paths and compounds appear in the fortunes themselves.
    lines += [l for l in fortune_lines(os.path.join(FORTUNES, "linux"), 100000) if max(map(len, l.split()), default=0) > 25]
    return lines


def escape(text):
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def test(args, work):
    lines = corpus()
    reference = BertTokenizer(args.vocab, do_lower_case=True)
    expected = [reference(l, add_special_tokens=True)["input_ids"] for l in lines]
    run = subprocess.run([args.probe, "tokenize", args.vocab], input="\n".join(map(escape, lines)) + "\n",
                         capture_output=True, text=True, check=True)
    ours = [[int(t) for t in row.split()] for row in run.stdout.splitlines()]
    check(len(ours) == len(lines), f"{len(ours)} outputs for {len(lines)} lines")
    mismatches = [(l, e, o) for l, e, o in zip(lines, expected, ours) if e != o]
    scripts = {"cyrillic": any("\u0400" <= c <= "\u04ff" for l in lines for c in l),
               "cjk": any("\u4e00" <= c <= "\u9fff" for l in lines for c in l),
               "accented": any(c in "éèàüößçñł" for l in lines for c in l)}
    print(f"{len(lines)} lines, {sum(map(len, expected))} tokens, {len(mismatches)} mismatches, scripts {scripts}")
    for line, e, o in mismatches[:5]:
        print(f"MISMATCH {line!r}\n  hf:   {e}\n  ours: {o}")
    check(len(lines) >= 2000 and all(scripts.values()) and not mismatches,
          f"{len(lines)} lines (2,000 at least), scripts {scripts}, {len(mismatches)} mismatches")


if __name__ == "__main__":
    run_test(test, ("--probe", "--vocab"), __doc__)
