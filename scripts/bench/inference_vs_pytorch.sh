#!/usr/bin/env bash
# Inference benchmark, one run: the worker's modes (eager, TorchScript, dynamic int8,
# an AOTInductor package) next to Python PyTorch eager on HF
# BertForSequenceClassification and ONNX Runtime on the same model exported to ONNX:
# same weights (one HF folder), same inputs (the same real-text token stream cut to each
# cell), same cells and threads, fp32 (int8 quantizes the Linear weights). Prints each
# figure and the ratio of our best mode to PyTorch and to ONNX Runtime per cell. Then the
# worker's sorted vs file-order batch inference throughput at batch 1/8/32/64 on the
# topics dev split. --json FILE also writes every figure there (scripts/bench/cpu_page.sh).
#   scripts/bench/inference_vs_pytorch.sh [--preset mini] [--threads 2] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
PRESET=mini THREADS=2 BATCHES="1 8 32" SEQS="32 128" JSON=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;; --json) JSON=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;; *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
LANGID=$PWD/data/prepared/langid TOPICS=$PWD/data/prepared/topics
"$PY" scripts/bench/inference_reference.py prepare --vocab "$LANGID/vocab.txt" --preset "$PRESET" --out "$WORK/model" \
  --with-onnx > "$WORK/prepare.log" 2>&1 || { cat "$WORK/prepare.log"; exit 1; }
"$PY" scripts/export_aoti.py --model "$WORK/model" --out "$WORK/model.pt2" --max-batch 64 --max-seq 512 \
  > "$WORK/aoti.log" 2>&1 || { cat "$WORK/aoti.log"; exit 1; }
cat > "$WORK/bench.yaml" <<YAML
name: bench_infer
kind: benchmark
data:
  train: $LANGID/train.tsv
  tokenizer: {vocab: $LANGID/vocab.txt}
model: {init: $WORK/model}
benchmark:
  batch_sizes: [$(echo $BATCHES | tr ' ' ',')]
  seq_lens: [$(echo $SEQS | tr ' ' ',')]
  modes: [eager, torchscript, int8, aoti]
  torchscript: $WORK/model/traced.pt
  aoti: $WORK/model.pt2
  warmup: 3
  iters: 10
runtime: {device: cpu, threads: $THREADS}
YAML
"$WORKER" "$WORK/bench.yaml" --runs-dir "$WORK/runs" > "$WORK/bench.log" 2>&1 || { cat "$WORK/bench.log"; exit 1; }
"$PY" scripts/bench/inference_reference.py time --vocab "$LANGID/vocab.txt" --data "$LANGID/train.tsv" \
  --model "$WORK/model" --onnx "$WORK/model/model.onnx" --threads "$THREADS" --batches $BATCHES --seqs $SEQS \
  > "$WORK/ref.json" 2>/dev/null
"$PY" - "$WORK/runs/bench_infer/benchmark.csv" "$WORK/ref.json" "$WORK/result.json" <<PY
import csv, json, sys
cells = list(csv.DictReader(open(sys.argv[1])))
ref = json.load(open(sys.argv[2]))
result = {"preset": "$PRESET", "threads": $THREADS, "latency": [], "sorted": []}
ours = {(c["mode"], c["batch"], c["seq_len"]): float(c["mean_ms"]) for c in cells if c["status"] == "ok"}
modes = ("eager", "torchscript", "int8", "aoti")
print(f"inference latency, preset $PRESET, fp32, $THREADS threads (mean ms per batch)")
print(f"{'batch x seq':>12}" + "".join(f"{m:>12}" for m in modes) +
      f"{'pytorch':>10}{'onnxrt':>10}   best mode  best/pt  best/ort")
for key, pt in ref["pytorch"].items():
    b, s = key.split("x")
    mine = {m: ours.get((m, b, s), float("nan")) for m in modes}
    best = min((v, m) for m, v in mine.items() if v == v)
    ort = ref["onnxruntime"].get(key, float("nan"))
    print(f"{key:>12}" + "".join(f"{mine[m]:12.3f}" for m in modes) +
          f"{pt:10.3f}{ort:10.3f}   {best[1]:>9} {best[0] / pt:8.3f} {best[0] / ort:9.3f}")
    result["latency"].append({"batch": int(b), "seq": int(s), **mine, "pytorch": pt, "onnxruntime": ort})
json.dump(result, open(sys.argv[3], "w"), indent=1)
PY
echo
echo "batch inference on topics dev (tiny preset), file order vs sorted by length:"
for B in 1 8 32 64; do
  cat > "$WORK/infer.yaml" <<YAML
name: bench_sorted_$B
kind: inference
data:
  labels: $TOPICS/labels.txt
  max_seq_len: 256
  tokenizer: {vocab: $TOPICS/vocab.txt}
model: {preset: tiny}
runtime: {device: cpu, threads: $THREADS}
inference: {input: $TOPICS/dev.tsv, batch_size: $B, sort_by_length: both}
YAML
  "$WORKER" "$WORK/infer.yaml" --runs-dir "$WORK/runs" > "$WORK/infer.log" 2>&1 || { cat "$WORK/infer.log"; exit 1; }
  "$PY" -c "
import json
s = json.load(open('$WORK/runs/bench_sorted_$B/summary.json'))
f, o = s['passes']['file order'], s['passes']['sorted by length']
result = json.load(open('$WORK/result.json'))
result['sorted'].append({'batch': $B, 'file_order_texts_per_s': f['texts_per_s'], 'sorted_texts_per_s': o['texts_per_s'],
                         'file_order_padding_pct': f['padding_pct'], 'sorted_padding_pct': o['padding_pct']})
json.dump(result, open('$WORK/result.json', 'w'), indent=1)
print(f'  batch {$B:>3}: file order {f[\"texts_per_s\"]:8.1f} texts/s ({f[\"padding_pct\"]:4.1f}% padding), '
      f'sorted {o[\"texts_per_s\"]:8.1f} texts/s ({o[\"padding_pct\"]:4.1f}% padding), speedup {s[\"sorted_speedup\"]:.2f}x')"
done
[[ -z $JSON ]] || cp "$WORK/result.json" "$JSON"
