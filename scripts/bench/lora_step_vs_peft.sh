#!/usr/bin/env bash
# LoRA training-step benchmark: the worker's model.lora fine-tune next to PEFT + HF
# (a plain PyTorch loop over get_peft_model(BertForSequenceClassification)) on the same
# base weights (one HF folder), LoRA r = alpha = R on query and value with the classifier
# trained in full, the same batch x seq tokens of real text, AdamW + clipping, threads;
# in one run, --repeats times each. Prints the median ms/step of each side and the ratio.
#   scripts/bench/lora_step_vs_peft.sh [--preset mini] [--batch 32] [--seq 128] [--steps 30]
#     [--r 8] [--threads 2] [--repeats 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
PRESET=mini BATCH=32 SEQ=128 STEPS=30 R=8 THREADS=2 REPEATS=3 WARMUP=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;; --seq) SEQ=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;; --r) R=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;; -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
TOPICS=data/prepared/topics
make_long_tsv "$TOPICS/train.tsv" "$WORK/long.tsv" "$((BATCH * (STEPS + 2)))"
LABELS=$(cut -f1 "$WORK/long.tsv" | tail -n +2 | sort -u | wc -l)
"$PY" - "$PRESET" "$TOPICS/vocab.txt" "$SEQ" "$LABELS" "$WORK/base" <<'PY'
import sys, torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer
preset, vocab, seq, labels, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
hidden, layers, heads, inter = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072)}[preset]
torch.manual_seed(0)
config = BertConfig(vocab_size=BertTokenizer(vocab).vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                    num_attention_heads=heads, intermediate_size=inter, max_position_embeddings=seq, num_labels=labels)
BertForSequenceClassification(config).save_pretrained(out, safe_serialization=True)
PY
cat > "$WORK/job.yaml" <<YAML
name: bench_lora_step
data:
  train: $WORK/long.tsv
  max_seq_len: $SEQ
  bucket_batches: 1
  loader_threads: 1
  tokenizer: {vocab: $PWD/$TOPICS/vocab.txt}
model: {init: $WORK/base, lora: {r: $R, alpha: $R}}
train: {epochs: 1, batch_size: $BATCH, max_steps: $STEPS, lr: 5.0e-4}
runtime: {device: cpu, threads: $THREADS}
log: {steps_every: 1, progress: false}
YAML
for i in $(seq "$REPEATS"); do
  "$WORKER" "$WORK/job.yaml" --runs-dir "$WORK/runs_$i" --resume none > "$WORK/worker_$i.log" 2>&1 ||
    { cat "$WORK/worker_$i.log"; exit 1; }
  "$PY" scripts/bench/train_step_reference.py --data "$WORK/long.tsv" --vocab "$TOPICS/vocab.txt" \
    --preset "$PRESET" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" \
    --labels "$LABELS" --init "$WORK/base" --lora-r "$R" > "$WORK/ref_$i.json" 2>/dev/null
done
"$PY" - "$WORK" "$REPEATS" "$WARMUP" <<PY
import json, statistics, sys
work, repeats, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ours, ref = [], []
for i in range(1, repeats + 1):
    ms = [json.loads(l)["ms"] for l in open(f"{work}/runs_{i}/bench_lora_step/steps.jsonl") if json.loads(l)["step"] > warmup]
    ours.append(sum(ms) / len(ms))
    ref.append(json.load(open(f"{work}/ref_{i}.json"))["ms_per_step"])
o, r = statistics.median(ours), statistics.median(ref)
print(f"LoRA train step, BERT $PRESET, r=$R on query/value, batch $BATCH x seq $SEQ, fp32 CPU, $THREADS threads")
print(f"  (mean ms/step over steps {warmup + 1}..$STEPS of each run; medians of {repeats} runs)")
print(f"  trainyard worker (C++)     {o:8.2f} ms/step   runs {[round(x, 1) for x in ours]}")
print(f"  PEFT + HF (Python)         {r:8.2f} ms/step   runs {[round(x, 1) for x in ref]}")
print(f"  ratio ours / PEFT          {o / r:8.3f}")
PY
