#!/usr/bin/env python3
"""Builds Trainyard's two text-classification tasks from Debian's fortunes* packages.

  langid  label = language of the fortune (en de it es pt pl ru cs eo)
  topics  label = the English fortune file it came from (computers, food, law, ...)

Each task gets train/dev/test TSV files (header `label<TAB>text`; the text has
backslash escapes for tab, newline and backslash), a labels.txt and a WordPiece
vocab.txt. The split is a fixed-seed shuffle, so the same packages always give the
same TSV files. The vocabularies are kept in scripts/vocab/ (<task>.txt, with the
SHA-256 of the train split they were trained on): Hugging Face's WordPiece trainer
orders its tokens, and breaks ties at the vocabulary's size, differently from run to
run, and a different vocabulary changes every model's numbers. A train split whose
checksum does not match gets a vocabulary trained afresh, with a warning.

Made from those files (so also where prepared data was copied in without fortunes):
  langid/bpe/  byte-level BPE vocab.json + merges.txt trained on langid's train split,
               specials <s> <pad> </s> <unk> <mask> <|endoftext|> (ids 0..5, as roberta-base)
  lm/          train.txt and dev.txt: the English topics fortunes, one a line, with the
               TSV escapes; lm/bpe/ a byte-level BPE trained on lm/train.txt with
               <|endoftext|> (id 0) as its only special token, for GPT-2-style jobs
Skips the work when the outputs exist, and makes only the missing ones.
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

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


KEPT_VOCABS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vocab")


def kept_vocab(name, train_path):
    """scripts/vocab/<name>.txt if it was trained on this train split, else None."""
    import hashlib
    vocab, checksum = os.path.join(KEPT_VOCABS, f"{name}.txt"), os.path.join(KEPT_VOCABS, f"{name}.train.sha256")
    if not (os.path.exists(vocab) and os.path.exists(checksum)):
        return None
    with open(train_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(checksum) as f:
        if f.read().strip() == digest:
            return vocab
    print(f"[prepare] warning: {name}'s train split is not the one {vocab} was trained on; training a vocabulary "
          "(its token order, and so every model's numbers, differ from run to run)")
    return None


def train_vocab(train_rows, out_dir, vocab_size):
    from tokenizers import BertWordPieceTokenizer
    tokenizer = BertWordPieceTokenizer(lowercase=True, strip_accents=None)
    tokenizer.train_from_iterator((t for _, t in train_rows), vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer.save_model(out_dir)


def unescape(field):
    """The inverse of escape(), as the worker reads the text column (UnescapeTsvField)."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), field)


def escaped_texts(tsv_path):
    """The escaped text column of a prepared TSV file."""
    with open(tsv_path, encoding="utf-8") as f:
        next(f)
        return [line.rstrip("\n").split("\t", 1)[1] for line in f]


def write_lines(path, lines):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def train_byte_level_bpe(texts, out_dir, vocab_size, special_tokens):
    """vocab.json and merges.txt in out_dir; merges.txt, checked for, is moved in last."""
    from tokenizers import ByteLevelBPETokenizer
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=special_tokens,
                                  show_progress=False)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tokenizer.save_model(tmp)
        for name in ("vocab.json", "merges.txt"):
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))


def has_bpe(out_dir):
    return all(os.path.exists(os.path.join(out_dir, f)) for f in ("vocab.json", "merges.txt"))


def build_derived(out_root, vocab_size):
    """The byte-level BPE vocabularies and the LM corpus, from the prepared TSV files."""
    langid_bpe = os.path.join(out_root, "langid", "bpe")
    if not has_bpe(langid_bpe):
        texts = [unescape(t) for t in escaped_texts(os.path.join(out_root, "langid", "train.tsv"))]
        train_byte_level_bpe(texts, langid_bpe, vocab_size, ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<|endoftext|>"])
        print(f"[prepare] langid: byte-level BPE -> {langid_bpe}")
    lm = os.path.join(out_root, "lm")
    os.makedirs(lm, exist_ok=True)
    for split in ("train", "dev"):
        path = os.path.join(lm, f"{split}.txt")
        if not os.path.exists(path):
            lines = escaped_texts(os.path.join(out_root, "topics", f"{split}.tsv"))
            write_lines(path, lines)
            print(f"[prepare] lm: {split}.txt, {len(lines)} fortunes")
    lm_bpe = os.path.join(lm, "bpe")
    if not has_bpe(lm_bpe):
        with open(os.path.join(lm, "train.txt"), encoding="utf-8") as f:
            texts = [unescape(line.rstrip("\n")) for line in f]
        train_byte_level_bpe(texts, lm_bpe, vocab_size, ["<|endoftext|>"])
        print(f"[prepare] lm: byte-level BPE -> {lm_bpe}")


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
    kept = kept_vocab(name, os.path.join(out_dir, "train.tsv"))
    if kept:
        shutil.copyfile(kept, os.path.join(out_dir, "vocab.txt.tmp"))
        os.replace(os.path.join(out_dir, "vocab.txt.tmp"), os.path.join(out_dir, "vocab.txt"))
    else:
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
    else:
        if not os.path.isdir(FORTUNE_DIR):
            sys.exit(f"prepare_data: {FORTUNE_DIR} is missing; run scripts/setup.sh first")
        build_task("langid", langid_examples(args.per_language), out, args.vocab_size, args.seed)
        build_task("topics", topics_examples(args.min_per_topic), out, args.vocab_size, args.seed)
    build_derived(out, args.vocab_size)


if __name__ == "__main__":
    main()
