#!/usr/bin/env bash
# Training-step benchmark: the C++ worker vs a plain PyTorch loop over Hugging Face
# BertForSequenceClassification, same preset, batch, sequence length, data, optimizer
# (AdamW + clipping) and thread count, in one run. Every batch is exactly
# batch x seq tokens (texts are joined fortunes long enough to be cut at seq), so both
# sides do identical work. Prints both ms/step figures and their ratio.
#   scripts/bench/train_step_vs_pytorch.sh [--preset mini] [--batch 32] [--seq 128]
#                                           [--steps 40] [--threads 2] [--precision fp32]
set -euo pipefail
cd "$(dirname "$0")/../.."
PRESET=mini BATCH=32 SEQ=128 STEPS=40 THREADS=2 PRECISION=fp32 WARMUP=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;; --seq) SEQ=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;; --precision) PRECISION=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if (( STEPS <= WARMUP )); then
  echo "error: --steps $STEPS: must be above the $WARMUP warm-up steps, which are not timed" >&2; exit 2
fi
source scripts/bench/common.sh
TOPICS=data/prepared/topics
"$PY" - "$TOPICS/train.tsv" "$WORK/long.tsv" "$((BATCH * (STEPS + 2)))" <<'PY'
import sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [l.rstrip("\n").split("\t", 1) for l in open(src, encoding="utf-8").readlines()[1:]]
out, i = [], 0
while len(out) < count:
    label, text = rows[i % len(rows)]
    while len(text) < 2000:            # long enough to fill any seq <= 512 tokens
        i += 1
        text += " " + rows[i % len(rows)][1]
    out.append(f"{label}\t{text}\n")
    i += 1
open(dst, "w", encoding="utf-8").write("label\ttext\n" + "".join(out))
PY
LABELS=$(cut -f1 "$WORK/long.tsv" | tail -n +2 | sort -u | wc -l)
cat > "$WORK/job.yaml" <<YAML
name: bench_train_step
data:
  train: $WORK/long.tsv
  max_seq_len: $SEQ
  bucket_batches: 1
  loader_threads: 1
  tokenizer: {vocab: $PWD/$TOPICS/vocab.txt}
model: {preset: $PRESET}
train: {epochs: 1, batch_size: $BATCH, max_steps: $STEPS, lr: 5.0e-4, precision: $PRECISION}
runtime: {device: cpu, threads: $THREADS}
log: {steps_every: 1, progress: false}
YAML
build/bin/worker "$WORK/job.yaml" --runs-dir "$WORK/runs" --resume none > "$WORK/worker.log" 2>&1 ||
  { cat "$WORK/worker.log"; exit 1; }
OURS=$("$PY" -c "
import json, sys
ms = [json.loads(l)['ms'] for l in open('$WORK/runs/bench_train_step/steps.jsonl')][$WARMUP:]
print(sum(ms) / len(ms))")
REF=$("$PY" scripts/bench/train_step_reference.py --data "$WORK/long.tsv" --vocab "$TOPICS/vocab.txt" \
  --preset "$PRESET" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" \
  --threads "$THREADS" --labels "$LABELS" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['ms_per_step'])")
"$PY" - "$OURS" "$REF" <<PY
import sys
ours, ref = map(float, sys.argv[1:])
print(f"train step, preset $PRESET, batch $BATCH x seq $SEQ, $PRECISION, $THREADS threads, "
      f"steps $((WARMUP + 1))..$STEPS")
print(f"  trainyard worker (C++)     {ours:8.1f} ms/step")
print(f"  PyTorch + HF (Python)      {ref:8.1f} ms/step")
print(f"  ratio ours / pytorch       {ours / ref:8.3f}")
PY
