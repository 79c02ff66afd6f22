#!/usr/bin/env python3
"""Builds Trainyard's two text-classification tasks from Debian's fortunes* packages.

  langid  label = language of the fortune (en de it es pt pl ru cs eo)
  topics  label = the English fortune file it came from (computers, food, law, ...)

Each task gets train/dev/test TSV files (header `label<TAB>text`; the text has
backslash escapes for tab, newline and backslash), a labels.txt and a WordPiece
vocab.txt trained on the train split. The split is a fixed-seed shuffle, so the
same packages always give the same files. Skips the work when the outputs exist.
"""
import argparse
import os
import random
import subprocess
import sys

FORTUNE_DIR = "/usr/share/games/fortunes"
LANGUAGE_DIRS = {"de": "de", "it": "it", "es": "es", "pl": "pl", "ru": "ru", "cs": "cs", "eo": "eo"}
# Files that are pictures or word lists rather than prose, so they say nothing about a language or a topic.
NOT_PROSE = {"art", "ascii-art", "asciiart", "banner", "translate-me"}
SPLITS = (("train", 0.8), ("dev", 0.1), ("test", 0.1))


def read_fortune_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    entries = []
    for chunk in text.split("\n%\n"):
        chunk = chunk.strip("%\n").strip()
        if len(chunk) >= 12:
            entries.append(chunk)
    return entries


def fortune_files(directory):
    names = sorted(os.listdir(directory))
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith((".dat", ".u8")) or name in NOT_PROSE or not os.path.isfile(path):
            continue
        yield name, path


def english_files():
    """The fortune files of the English packages, by dpkg's own list."""
    listing = subprocess.run(["dpkg", "-L", "fortunes", "fortunes-min"], capture_output=True, text=True,
                             check=True).stdout.split()
    for path in sorted(set(listing)):
        name = os.path.basename(path)
        if os.path.dirname(path) == FORTUNE_DIR and "." not in name and name not in NOT_PROSE \
                and os.path.isfile(path):
            yield name, path


def langid_examples(per_language):
    by_language = {"en": [t for _, p in english_files() for t in read_fortune_file(p)],
                   "pt": read_fortune_file(os.path.join(FORTUNE_DIR, "brasil"))}
    for lang, sub in LANGUAGE_DIRS.items():
        by_language[lang] = [t for _, p in fortune_files(os.path.join(FORTUNE_DIR, sub))
                             for t in read_fortune_file(p)]
    examples = []
    rng = random.Random(1234)
    for lang in sorted(by_language):
        texts = sorted(set(by_language[lang]))
        rng.shuffle(texts)
        examples += [(lang, t) for t in texts[:per_language]]
    return examples


def topics_examples(min_per_topic):
    examples = []
    for name, path in english_files():
        texts = sorted(set(read_fortune_file(path)))
        if len(texts) >= min_per_topic:
            examples += [(name, t) for t in texts]
    return examples


def escape(text):
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "")


def write_split(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("label\ttext\n")
        for label, text in rows:
            f.write(f"{label}\t{escape(text)}\n")
    os.replace(tmp, path)


def train_vocab(train_rows, out_dir, vocab_size):
    from tokenizers import BertWordPieceTokenizer
    tokenizer = BertWordPieceTokenizer(lowercase=True, strip_accents=None)
    tokenizer.train_from_iterator((t for _, t in train_rows), vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer.save_model(out_dir)


def is_prepared(out_dir):
    return all(os.path.exists(os.path.join(out_dir, f)) for f in ("train.tsv", "dev.tsv", "test.tsv", "vocab.txt"))


def build_task(name, examples, out_root, vocab_size, seed):
    out_dir = os.path.join(out_root, name)
    if is_prepared(out_dir):
        print(f"[prepare] {name}: already prepared in {out_dir}")
        return
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    rng.shuffle(examples)
    start = 0
    splits = {}
    for split, share in SPLITS:
        end = len(examples) if split == SPLITS[-1][0] else start + int(share * len(examples))
        splits[split] = examples[start:end]
        start = end
    for split, rows in splits.items():
        write_split(os.path.join(out_dir, f"{split}.tsv"), rows)
    labels = sorted({label for label, _ in examples})
    with open(os.path.join(out_dir, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(labels) + "\n")
    train_vocab(splits["train"], out_dir, vocab_size)
    sizes = ", ".join(f"{s} {len(r)}" for s, r in splits.items())
    print(f"[prepare] {name}: {len(labels)} labels, {sizes} -> {out_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "prepared"))
    parser.add_argument("--per-language", type=int, default=2500, help="fortunes kept per language (langid)")
    parser.add_argument("--min-per-topic", type=int, default=150, help="smallest English file kept as a topic")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=20261121)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    # Prepared data copied from elsewhere (a GPU machine has no fortunes packages) is enough.
    if all(is_prepared(os.path.join(out, name)) for name in ("langid", "topics")):
        print(f"[prepare] langid, topics: already prepared in {out}")
        return
    if not os.path.isdir(FORTUNE_DIR):
        sys.exit(f"prepare_data: {FORTUNE_DIR} is missing; run scripts/setup.sh first")
    build_task("langid", langid_examples(args.per_language), out, args.vocab_size, args.seed)
    build_task("topics", topics_examples(args.min_per_topic), out, args.vocab_size, args.seed)


if __name__ == "__main__":
    main()
