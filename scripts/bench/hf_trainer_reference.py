#!/usr/bin/env python3
"""The Hugging Face side of finetune_vs_hf_trainer.sh: the same fine-tune as the worker's
job, run the way a Trainer user runs it. The model is a fresh BertForSequenceClassification
of the same preset (sizes, max positions = max length, dropout), or with --init the
Hugging Face folder the worker's job starts from too (from_pretrained); the tokenizer is
BertTokenizerFast over the same vocab.txt, and the texts are tokenized up front and padded
per batch by DataCollatorWithPadding. Trainer gets the same epochs, batch, peak lr, linear
warm-up ratio and decay, AdamW betas/eps, weight decay, clipping, seed and thread count,
evaluates and saves a checkpoint after every epoch (as the worker does), and saves the
final model. --group-by-length turns on Trainer's LengthGroupedSampler (mega-batches of 50
batches, as the worker's bucket_batches: 50). --device cuda trains on the GPU,
--precision bf16 sets bf16=True (autocast), --torch-compile sets torch_compile=True. Every
other argument stays at Trainer's default, the optimizer included. Runs under transformers
4.x and 5.x (5 renamed group_by_length to train_sampling_strategy and made the fast
tokenizer take its vocabulary as a dict, and a warm-up ratio is a warmup_steps below 1).

--accumulation, --schedule, --eval-steps and --best-metric set gradient_accumulation_steps,
lr_scheduler_type, evaluations (and checkpoints) every N steps with accuracy and macro F1,
precision and recall (scikit-learn), and load_best_model_at_end with metric_for_best_model.

After each evaluation it prints one JSON line {"epoch", "step", "eval_acc", "eval_loss",
"eval_f1", "eval_runtime", "t"}, t being time.time() when the evaluation ended, so the
caller can time the accuracy reached."""
import argparse
import csv
import json
import os
import sys
import time

import dataclasses

import torch
import transformers
from transformers import (BertConfig, BertForSequenceClassification, BertTokenizerFast, DataCollatorWithPadding,
                          Trainer, TrainerCallback, TrainingArguments)

PRESETS = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}


def unescape(text):
    # The prepared TSV files escape backslash, tab and newline (scripts/prepare_data.py).
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(text[i + 1], text[i:i + 2]))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_tsv(path, label_ids):
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [unescape(r[1]) for r in rows], [label_ids[r[0]] for r in rows]


def encode(tokenizer, texts, labels, max_len):
    enc = tokenizer(texts, truncation=True, max_length=max_len)
    return [{"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": label}
            for ids, types, mask, label in zip(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], labels)]


class EvalStamps(TrainerCallback):
    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        print(json.dumps({"epoch": round(state.epoch or 0), "step": state.global_step,
                          "eval_acc": metrics["eval_accuracy"], "eval_loss": metrics["eval_loss"],
                          "eval_f1": metrics.get("eval_f1"), "eval_runtime": metrics.get("eval_runtime"),
                          "t": time.time()}), flush=True)


def make_tokenizer(vocab_path):
    if int(transformers.__version__.split(".")[0]) >= 5:
        with open(vocab_path, encoding="utf-8") as f:
            vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        return BertTokenizerFast(vocab=vocab, do_lower_case=True)
    return BertTokenizerFast(vocab_file=vocab_path, do_lower_case=True)


TRAINING_FIELDS = {f.name for f in dataclasses.fields(TrainingArguments)}


def sampling_arguments(group_by_length):
    """Trainer's length-grouped sampler, by the name this transformers version gives it."""
    if "train_sampling_strategy" in TRAINING_FIELDS:
        return {"train_sampling_strategy": "group_by_length" if group_by_length else "random"}
    return {"group_by_length": group_by_length}


def warmup_arguments(ratio):
    """The warm-up as a share of the steps: warmup_ratio in 4.x; in 5.x a warmup_steps
    below 1 is that ratio (both round up: ceil(steps x ratio))."""
    if "warmup_ratio" in TRAINING_FIELDS:
        return {"warmup_ratio": ratio}
    return {"warmup_steps": ratio}


def precision_arguments(a):
    out = {"use_cpu": a.device == "cpu", "bf16": a.precision == "bf16"}
    if a.torch_compile:
        out["torch_compile"] = True
    return out


class StepClock(TrainerCallback):
    """The wall time of the training loop alone (first step begun to last step ended), so a
    reader can tell setup (imports, tokenizing, compiling) from stepping."""
    def __init__(self):
        self.first = self.last = None
        self.steps = 0

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first is None:
            self.first = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        self.last = time.time()
        self.steps += 1


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def classification_metrics(prediction):
    """What a Trainer user computes for an imbalanced task: accuracy and macro averages."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support
    predicted, labels = prediction.predictions.argmax(-1), prediction.label_ids
    precision, recall, f1, _ = precision_recall_fscore_support(labels, predicted, average="macro", zero_division=0)
    return {"accuracy": accuracy_score(labels, predicted), "f1": f1, "precision": precision, "recall": recall}


def evaluation_arguments(a):
    """Evaluations and checkpoints every epoch, or every --eval-steps steps; with
    --best-metric the best one's checkpoint is kept and loaded at the end."""
    if not a.eval_steps:
        return {"eval_strategy": "epoch", "save_strategy": "epoch", "save_total_limit": 2}
    out = {"eval_strategy": "steps", "eval_steps": a.eval_steps, "save_strategy": "steps",
           "save_steps": a.eval_steps, "save_total_limit": 2}
    if a.best_metric:
        out.update(load_best_model_at_end=True, metric_for_best_model=a.best_metric,
                   greater_is_better=a.best_metric != "loss")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--labels", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--group-by-length", action="store_true")
    p.add_argument("--init", default="", help="a Hugging Face folder to start from (else a fresh --preset model)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--torch-compile", action="store_true")
    p.add_argument("--accumulation", type=int, default=1, help="gradient_accumulation_steps")
    p.add_argument("--schedule", default="linear", choices=("linear", "cosine", "constant_with_warmup"))
    p.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (0: every epoch)")
    p.add_argument("--best-metric", default="", help="metric_for_best_model (f1, accuracy, loss)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    with open(a.labels, encoding="utf-8") as f:
        label_ids = {name: i for i, name in enumerate(line.strip() for line in f if line.strip())}
    tokenizer = make_tokenizer(a.vocab)
    train = encode(tokenizer, *read_tsv(a.train, label_ids), a.max_len)
    dev = encode(tokenizer, *read_tsv(a.dev, label_ids), a.max_len)
    torch.manual_seed(a.seed)
    if a.init:
        model = BertForSequenceClassification.from_pretrained(a.init, num_labels=len(label_ids))
    else:
        hidden, layers, heads, inter = PRESETS[a.preset]
        config = BertConfig(vocab_size=len(tokenizer.vocab), hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=a.max_len,
                            hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout,
                            num_labels=len(label_ids))
        model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=a.out, num_train_epochs=a.epochs, per_device_train_batch_size=a.batch,
        per_device_eval_batch_size=2 * a.batch, learning_rate=a.lr, **warmup_arguments(a.warmup_ratio),
        lr_scheduler_type=a.schedule, weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm, seed=a.seed,
        gradient_accumulation_steps=a.accumulation, **evaluation_arguments(a),
        logging_steps=20, report_to="none", disable_tqdm=True, **sampling_arguments(a.group_by_length),
        **precision_arguments(a))
    clock = StepClock()
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                      data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=classification_metrics if a.eval_steps else accuracy,
                      callbacks=[EvalStamps(), clock])
    print(json.dumps({"optimizer": str(args.optim), "threads": torch.get_num_threads(),
                      "transformers": transformers.__version__, "device": str(args.device)}), flush=True)
    trainer.train()
    trainer.save_model(os.path.join(a.out, "model"))
    print(json.dumps({"steps": clock.steps, "train_loop_s": (clock.last or 0) - (clock.first or 0),
                      "best_metric": trainer.state.best_metric}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
