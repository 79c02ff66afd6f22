#!/usr/bin/env python3
"""Byte-level BPE parity: our ids (tests/tools/tokenize_tool.cc) equal Hugging Face's
GPT2TokenizerFast and RobertaTokenizerFast on the same vocab.json and merges.txt: the
GPT-2 pieces, RoBERTa's "<s> text </s>" template, truncation at several lengths and
add_prefix_space. The texts are >2,000 real fortunes lines in several scripts plus
hand-made edge cases (whitespace runs and kinds, contractions, digits, emoji,
combining marks, special tokens written in the text) and seeded random text. Three
vocabularies: the prepared langid one (RoBERTa's specials), the prepared lm one
(<|endoftext|> only: the GPT-2 template by default) and one trained here on the test
lines, so merges inside CJK, Cyrillic and emoji are exercised too. Prints the encode
speed for information."""
import os
import random
import re
import subprocess
import sys
import time

from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2TokenizerFast, RobertaTokenizerFast

from tokenizer_parity import corpus, escape

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<|endoftext|>"]

EDGE_LINES = [
    "", " ", "  ", "\t", "\n", " \n ", "Hello  world   x\n\n y", "trailing spaces   ", "trailing tab\t",
    "\ttabbed\t\tline", "lines\n\n\nbreak\r\nhere", "mixed \t \n\r\n  ws", "   leading spaces", "\nleading newline",
    # Whitespace to Oniguruma (VT, NEL, NBSP, U+2028, U+3000) and not (FS, ZWSP).
    "a\x0bb \x0b c", "nel\x85x \x85 y", "nbsp\xa0x \xa0y", "\xa0leading nbsp", "ideo\u3000x \u3000y",
    "ls\u2028x \u2028 y", "fs\x1cx \x1c y", "zw\u200bx \u200by",
    "it's IT'S we'll I'm you're they've he'd 'S 'll n't don't", "'s", "''", "rock'n'roll", " 's 'S",
    "12345 1,234.56 3rd \u0663\u0664 \u2177 \u00b2", "emoji \U0001F600\U0001F44D\U0001F3FD family "
    "\U0001F468\u200d\U0001F469\u200d\U0001F467 flag \U0001F1E9\U0001F1EA",
    "combining e\u0301 a\u0308 \u00f1 vs n\u0303", "\u00dcn\u00efc\u00f6d\u00e9 \u00c0\u00c9\u00ce\u00d5\u00dc \u00df \u1e9e",
    "中文没有空格的句子。", "日本語のテキスト、カタカナ。", "한국어 텍스트", "Ελληνικά κείμενα", "עברית", "العربية",
    "<s>", "</s>", "a<s>b", "x <pad> y", "<unk><mask>", "a <mask> b", "a\n\t <mask>b", "<s> <mask>", "<|endoftext|>",
    "a<|endoftext|>b", " <|endoftext|> ", "<<s>>", "<s<s>>", "<mask", "mask>", "<|endoftext|", "</s></s>x",
    "x" * 300, "ab " * 200, "!!!???...,,,", "a-b_c/d\\e", "\\backslash\\t not a tab", "tab\tin\tthe\tmiddle",
]


def random_lines(count):
    """Seeded random text: whitespace of every kind, contraction letters, digits and
    code points from every plane (unassigned ones too, no surrogates)."""
    rng = random.Random(13)
    frequent = " \t\n\x0b\x0c\r\x1c\x1f\x85\xa0\u1680\u2007\u200b\u2028\u2029\u202f\u3000\ufeff'sSltdmrev09<>|"

    def code_point():
        r = rng.random()
        if r < 0.3:
            return rng.choice(frequent)
        top = 0x800 if r < 0.6 else 0x10000 if r < 0.9 else 0x110000
        c = rng.randrange(0x20, top)
        return code_point() if 0xD800 <= c <= 0xDFFF else chr(c)

    return ["".join(code_point() for _ in range(rng.randrange(0, 40))) for _ in range(count)]


def run_ours(tool, vocab, merges, lines, flags):
    """Our ids for each line, and the seconds the tool spent encoding."""
    run = subprocess.run([tool, vocab, merges, *flags], input="".join(escape(l) + "\n" for l in lines),
                         capture_output=True, text=True, check=True)
    rows = [[int(t) for t in row.split()] for row in run.stdout.splitlines()]
    check(len(rows) == len(lines), f"{len(rows)} outputs for {len(lines)} lines")
    seconds = float(re.search(r"in ([0-9.]+) s", run.stderr).group(1))
    return rows, seconds


def configurations(vocab, merges):
    """(name, HF tokenizer, HF call options, our flags) for each way of encoding."""
    gpt2 = GPT2TokenizerFast(vocab_file=vocab, merges_file=merges)
    gpt2_prefix = GPT2TokenizerFast(vocab_file=vocab, merges_file=merges, add_prefix_space=True)
    roberta = RobertaTokenizerFast(vocab_file=vocab, merges_file=merges)
    roberta_prefix = RobertaTokenizerFast(vocab_file=vocab, merges_file=merges, add_prefix_space=True)
    plain = {"add_special_tokens": False}
    out = [("gpt2", gpt2, plain, ["--template", "gpt2"]),
           ("gpt2 max_length=16", gpt2, dict(plain, truncation=True, max_length=16),
            ["--template", "gpt2", "--max-len", "16"]),
           ("gpt2 add_prefix_space", gpt2_prefix, plain, ["--template", "gpt2", "--add-prefix-space"]),
           ("roberta", roberta, {}, ["--template", "roberta"]),
           ("auto (= roberta: <s> and </s> in vocab)", roberta, {}, []),
           ("roberta add_prefix_space", roberta_prefix, {}, ["--template", "roberta", "--add-prefix-space"])]
    for length in (8, 32, 128):
        out.append((f"roberta max_length={length}", roberta, {"truncation": True, "max_length": length},
                    ["--template", "roberta", "--max-len", str(length)]))
    return out


def gpt2_configurations(vocab, merges):
    """For a vocabulary without <s> and </s>: the GPT-2 template, also chosen by default."""
    gpt2 = GPT2TokenizerFast(vocab_file=vocab, merges_file=merges)
    plain = {"add_special_tokens": False}
    return [("gpt2", gpt2, plain, ["--template", "gpt2"]), ("auto (= gpt2: no <s>, </s> in vocab)", gpt2, plain, [])]


def compare(tool, vocab, merges, lines, label, make_configurations=configurations):
    """Mismatch count over every configuration; prints each one's result."""
    total = 0
    for name, reference, options, flags in make_configurations(vocab, merges):
        expected = reference(lines, **options)["input_ids"]
        ours, seconds = run_ours(tool, vocab, merges, lines, flags)
        bad = [(l, e, o) for l, e, o in zip(lines, expected, ours) if e != o]
        print(f"[{label}] {name}: {len(lines)} lines, {sum(map(len, expected))} ids, {len(bad)} mismatches "
              f"(ours {seconds:.3f} s, cold cache)")
        for line, e, o in bad[:3]:
            print(f"  MISMATCH {line!r}\n    hf:   {e} {reference.convert_ids_to_tokens(e)}\n    ours: {o}")
        total += len(bad)
    return total


def report_speed(tool, vocab, merges, lines):
    """Information only: our encode loop (cold cache, then warm) against HF's batch call."""
    text_bytes = sum(len(l.encode()) for l in lines)
    _, cold = run_ours(tool, vocab, merges, lines, ["--template", "gpt2"])
    _, warm = run_ours(tool, vocab, merges, lines * 5, ["--template", "gpt2"])
    reference = GPT2TokenizerFast(vocab_file=vocab, merges_file=merges)
    start = time.perf_counter()
    reference(lines, add_special_tokens=False)
    hf = time.perf_counter() - start
    print(f"speed: {len(lines)} lines, {text_bytes / 1e6:.2f} MB: ours {cold * 1e3:.1f} ms on one thread with a "
          f"cold cache ({text_bytes / cold / 1e6:.1f} MB/s), {warm / 5 * 1e3:.1f} ms a pass over 5 passes; HF fast "
          f"batch call {hf * 1e3:.1f} ms (Rust, all cores)")


def test(args, work):
    fortunes = corpus()
    lines = fortunes + EDGE_LINES + random_lines(1000)
    scripts = {"cyrillic": any("\u0400" <= c <= "\u04ff" for l in fortunes for c in l),
               "cjk": any("\u4e00" <= c <= "\u9fff" for l in fortunes for c in l),
               "accented": any(c in "éèàüößçñł" for l in fortunes for c in l)}
    print(f"{len(lines)} lines: {len(fortunes)} fortunes (scripts {scripts}), {len(EDGE_LINES)} hand-made, 1000 random")
    prepared = (os.path.join(args.vocab_dir, "vocab.json"), os.path.join(args.vocab_dir, "merges.txt"))
    mismatches = compare(args.tokenize, *prepared, lines, "prepared langid vocab")
    lm = (os.path.join(args.lm_vocab_dir, "vocab.json"), os.path.join(args.lm_vocab_dir, "merges.txt"))
    mismatches += compare(args.tokenize, *lm, lines, "prepared lm vocab", gpt2_configurations)
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(fortunes + EDGE_LINES, vocab_size=8000, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                show_progress=False)
    trained.save_model(work)
    own = (os.path.join(work, "vocab.json"), os.path.join(work, "merges.txt"))
    merge_count = sum(1 for _ in open(own[1], encoding="utf-8")) - 1
    print(f"vocab trained on these lines: {merge_count} merges")
    mismatches += compare(args.tokenize, *own, lines, "vocab trained on the test lines")
    report_speed(args.tokenize, *own, fortunes)
    print(f"total mismatches: {mismatches}")
    check(len(fortunes) >= 2000 and all(scripts.values()) and not mismatches,
          f"{len(fortunes)} fortunes (2,000 at least), scripts {scripts}, {mismatches} mismatches")


def options(parser):
    parser.add_argument("--tokenize", required=True, help="the ty_tokenize binary")
    parser.add_argument("--vocab-dir", required=True, help="folder with vocab.json and merges.txt (prepared langid)")
    parser.add_argument("--lm-vocab-dir", required=True, help="the same, with <|endoftext|> only (prepared lm)")


if __name__ == "__main__":
    run_test(test, (), __doc__, options)
