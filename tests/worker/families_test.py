#!/usr/bin/env python3
"""Every model family fine-tunes through the worker on real data: langid (9 languages of
fortunes), tiny presets, the same data, epochs and hyper-parameters. RoBERTa (byte-level
BPE, <s> text </s>), DistilBERT (WordPiece) and the GPT-2 classifier (BPE, last token)
reach accuracy comparable to BERT's, and transformers' Auto classes load each saved model
as its family's class, with the family's released position count (trained on 32-token
texts)."""
import csv
import os
import subprocess
import sys

from transformers import AutoModelForSequenceClassification

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import LANGID, subset_tsv, write  # noqa: E402

BPE = os.path.join(LANGID, "bpe")
TOKENIZERS = {
    "bert": f"{{vocab: {LANGID}/vocab.txt}}",
    "distilbert": f"{{vocab: {LANGID}/vocab.txt}}",
    "roberta": f"{{kind: bpe, vocab: {BPE}/vocab.json, merges: {BPE}/merges.txt, template: roberta}}",
    "gpt2": f"{{kind: bpe, vocab: {BPE}/vocab.json, merges: {BPE}/merges.txt, template: gpt2}}",
}
# Comparable: within this many accuracy points of BERT's, and well above chance (1/9).
# The margin allows for run-to-run spread: the prepared vocabularies are retrained on a
# fresh machine, and a tiny model's accuracy after a few epochs moves with them.
MARGIN, FLOOR = 0.06, 0.85


def job(work, family, train):
    return f"""name: {family}
seed: 5
data:
  train: {train}
  dev: {LANGID}/dev.tsv
  labels: {LANGID}/labels.txt
  max_seq_len: 32
  loader_threads: 1
  tokenizer: {TOKENIZERS[family]}
model: {{family: {family}, preset: tiny, dropout: 0.1}}
train: {{epochs: 2, batch_size: 32, lr: 1.0e-3}}
runtime: {{device: cpu, threads: 1}}
log: {{runs_dir: {os.path.join(work, "runs")}, progress: false}}
"""


def accuracies(work, family):
    with open(os.path.join(work, "runs", family, "epochs.csv")) as f:
        return [float(row["eval_acc"]) for row in csv.DictReader(f)]


# Trained on 32-token texts, a preset keeps its family's released positions (RoBERTa's
# count past its padding id), so the exported model takes longer inputs later.
POSITIONS = {"bert": 512, "distilbert": 512, "roberta": 514, "gpt2": 1024}


def loads_in_transformers(work, family):
    """The class transformers loads the saved model as, and its position count."""
    model = AutoModelForSequenceClassification.from_pretrained(os.path.join(work, "runs", family, "model"))
    config = model.config
    return type(model).__name__, getattr(config, "n_positions", None) or config.max_position_embeddings


def test(args, work):
    accuracy, classes, curve, positions = {}, {}, {}, {}
    train = subset_tsv(work, 4000)
    for family in TOKENIZERS:
        path = os.path.join(work, f"{family}.yaml")
        write(path, job(work, family, train))
        run = subprocess.run([args.worker, path], capture_output=True, text=True, timeout=900)
        check(run.returncode == 0, f"{family} failed:\n{run.stderr[-3000:]}")
        curve[family] = accuracies(work, family)
        accuracy[family] = curve[family][-1]
        classes[family], positions[family] = loads_in_transformers(work, family)
    ok = True
    for family, acc in accuracy.items():
        good = acc >= FLOOR and acc >= accuracy["bert"] - MARGIN and positions[family] == POSITIONS[family]
        print(f"{'ok  ' if good else 'FAIL'} {family:10s} dev accuracy {acc:.3f} (BERT {accuracy['bert']:.3f}); "
              f"by epoch {curve[family]}; transformers loads it as {classes[family]} with {positions[family]} "
              f"positions")
        ok &= good
    check(ok, "a family's accuracy falls short of BERT's, or its model has other positions (the FAIL lines above)")


if __name__ == "__main__":
    run_test(test, description=__doc__)
