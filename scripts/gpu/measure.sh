#!/usr/bin/env bash
# The GPU measurements of docs/performance.md, each next to its reference from the same
# run, on a machine where build_and_test.sh has built the tree (run it there after that
# script, in the same environment). Writes $OUT/performance.md (the tables, with the
# machine, driver, torch version and the exact commands) and $OUT/measurements.json.
#   scripts/gpu/measure.sh [SECTION...]
# Sections (default: all, in this order; each fits one 10-minute call on an H100):
#   finetune   bert-base train step, seq 128, batch 32 and 64, fp32 (TF32 off/on),
#              bf16, fp16: ours vs HF + PyTorch eager and torch.compile, with MFU; and
#              bf16 with whole-step CUDA graphs (train.cuda_graph) against
#              torch.compile(mode="reduce-overhead")
#   datawait   data wait as a share of the step, topics tokenized on the fly (bf16, b64)
#   inference  bert-base grid batch [1,2,4,8] x seq [8..512] x fp32/bf16/fp16 x
#              eager/cuda_graph, next to PyTorch eager; batch-1 latency at seq 128
#   sorted     sorted-by-length vs file-order batch inference on topics at batch 64
#   generate   GPT-2-small-shaped generation, 32-token prompts, 64 new tokens, batch 1
#              and 8, fp32/bf16/fp16: ours eager and with CUDA-graph decode steps (a
#              benchmark job's generate cells) vs HF generate() under the same autocast
#   profile    not in the default list: the worker's Kineto profile (5 steps) of the bf16
#              and fp32+TF32 train steps at batch 64, into $OUT/profile_<precision>.txt
# Environment: TRAINYARD_BIN (the worker's folder, default build/bin), TRAINYARD_PYTHON
# (default python3), OUT (default ./gpu-out), COMPILE: the finetune configurations also
# timed under torch.compile (default "bf16 fp32_tf32"; "all"; compiling takes about a
# minute each), BATCHES: the finetune batch sizes (default "32 64").
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in -h|--help) sed -n '2,19p' "$0"; exit 0 ;; esac
SECTIONS=("$@")
[[ ${#SECTIONS[@]} -gt 0 ]] || SECTIONS=(finetune datawait inference sorted generate)
for s in "${SECTIONS[@]}"; do
  case "$s" in finetune|datawait|inference|sorted|generate|profile) ;;
    *) echo "error: unknown section '$s'" >&2; exit 2 ;; esac
done
export TRAINYARD_PYTHON="${TRAINYARD_PYTHON:-$(command -v python3)}"
export TRAINYARD_BIN="${TRAINYARD_BIN:-build/bin}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
RESULTS="$OUT/measurements.json"
[[ -f $RESULTS ]] || echo '{}' > "$RESULTS"
source scripts/bench/common.sh
TOPICS=$PWD/data/prepared/topics LANGID=$PWD/data/prepared/langid LM=$PWD/data/prepared/lm

# Adds KEY = JSON file's content to measurements.json.
record() { "$PY" - "$RESULTS" "$1" "$2" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))
results[sys.argv[2]] = json.load(open(sys.argv[3]))
json.dump(results, open(sys.argv[1], "w"), indent=1)
PY
}

machine() {
  "$PY" - <<'PY' > "$WORK/machine.json"
import json, subprocess, torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"gpu": torch.cuda.get_device_name(0), "nvidia_smi": smi, "torch": torch.__version__,
                  "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}))
PY
  record machine "$WORK/machine.json"
}

finetune() {
  local batch config compile
  for batch in ${BATCHES:-32 64}; do
    for config in fp32 fp32_tf32 bf16 fp16 bf16_graph; do
      local precision=${config%_tf32}
      precision=${precision%_graph}
      local args=(--device cuda --preset base --seq 128 --batch "$batch" --steps 60 --threads 4
                  --precision "$precision" --json "$WORK/ft.json")
      [[ $config == *_tf32 ]] && args+=(--tf32)
      compile=false
      [[ " ${COMPILE:-bf16 fp32_tf32} " == *" $config "* || ${COMPILE:-} == all ]] && compile=true
      [[ $compile == true ]] && args+=(--compile)
      [[ $config == *_graph ]] && args+=(--cuda-graph --compile-mode reduce-overhead)
      echo "+ scripts/bench/train_step_vs_pytorch.sh ${args[*]}"
      scripts/bench/train_step_vs_pytorch.sh "${args[@]}"
      record "finetune_b${batch}_${config}" "$WORK/ft.json"
    done
  done
}

datawait() {
  cat > "$WORK/datawait.yaml" <<YAML
name: datawait
data:
  train: $TOPICS/train.tsv
  dev: $TOPICS/dev.tsv
  labels: $TOPICS/labels.txt
  max_seq_len: 128
  tokenizer: {vocab: $TOPICS/vocab.txt}
model: {preset: base}
train: {epochs: 1, batch_size: 64, max_steps: 300, precision: bf16}
runtime: {device: cuda}
log: {steps_every: 20, progress: false}
YAML
  echo "+ $WORKER $WORK/datawait.yaml (bert-base, topics, bf16, batch 64, 300 steps)"
  "$WORKER" "$WORK/datawait.yaml" --runs-dir "$WORK/runs" --resume none | tail -3
  "$PY" - "$WORK/runs/datawait/epochs.csv" > "$WORK/datawait.json" <<'PY'
import csv, json, sys
row = list(csv.DictReader(open(sys.argv[1])))[-1]
print(json.dumps({k: float(row[k]) for k in ("ms_per_step", "wait_ms", "h2d_ms", "forward_ms", "backward_ms",
                                             "optimizer_ms", "data_wait_pct", "samples_per_s")}))
PY
  record datawait "$WORK/datawait.json"
}

inference() {
  "$PY" scripts/bench/inference_reference.py prepare --vocab "$LANGID/vocab.txt" --preset base --out "$WORK/model"
  cat > "$WORK/grid.yaml" <<YAML
name: grid
kind: benchmark
data:
  train: $LANGID/train.tsv
  tokenizer: {vocab: $LANGID/vocab.txt}
model: {init: $WORK/model}
benchmark:
  batch_sizes: [1, 2, 4, 8]
  seq_lens: [8, 64, 128, 256, 512]
  precisions: [fp32, bf16, fp16]
  modes: [eager, cuda_graph]
  warmup: 10
  iters: 100
runtime: {device: cuda}
YAML
  echo "+ $WORKER $WORK/grid.yaml"
  "$WORKER" "$WORK/grid.yaml" --runs-dir "$WORK/runs" > "$WORK/grid.log" 2>&1 || { tail -20 "$WORK/grid.log"; exit 1; }
  local p
  for p in fp32 bf16 fp16; do
    echo "+ inference_reference.py time --device cuda --precision $p"
    "$PY" scripts/bench/inference_reference.py time --vocab "$LANGID/vocab.txt" --data "$LANGID/train.tsv" \
      --model "$WORK/model" --device cuda --precision "$p" --batches 1 2 4 8 --seqs 8 64 128 256 512 \
      --warmup 10 --iters 100 > "$WORK/ref_$p.json"
  done
  "$PY" - "$WORK/runs/grid/benchmark.csv" "$WORK" > "$WORK/grid.json" <<'PY'
import csv, json, sys
cells = [c for c in csv.DictReader(open(sys.argv[1]))]
ref = {p: json.load(open(f"{sys.argv[2]}/ref_{p}.json"))["pytorch"] for p in ("fp32", "bf16", "fp16")}
print(json.dumps({"cells": cells, "pytorch_eager_mean_ms": ref}))
PY
  record inference "$WORK/grid.json"
}

sorted_gain() {
  cat > "$WORK/sorted.yaml" <<YAML
name: sorted
kind: inference
data:
  labels: $TOPICS/labels.txt
  max_seq_len: 512
  tokenizer: {vocab: $TOPICS/vocab.txt}
model: {preset: base}
train: {precision: bf16}
runtime: {device: cuda}
inference: {input: $TOPICS/test.tsv, batch_size: 64, sort_by_length: both}
YAML
  echo "+ $WORKER $WORK/sorted.yaml"
  "$WORKER" "$WORK/sorted.yaml" --runs-dir "$WORK/runs" | tail -3
  record sorted "$WORK/runs/sorted/summary.json"
}

generate() {
  local bpe=(--vocab "$LM/bpe/vocab.json" --merges "$LM/bpe/merges.txt") p
  "$PY" scripts/bench/generate_reference.py prepare "${bpe[@]}" --shape small --out "$WORK/gpt2" \
    --dev "$LM/dev.txt" --prompts "$WORK/prompts.txt"
  cat > "$WORK/generate.yaml" <<YAML
name: generate_cells
kind: benchmark
task: causal_lm
data:
  train: $LM/train.txt
  tokenizer: {kind: bpe, vocab: $LM/bpe/vocab.json, merges: $LM/bpe/merges.txt}
model: {init: $WORK/gpt2}
runtime: {device: cuda}
benchmark:
  mode: generate
  batch_sizes: [1, 8]
  seq_lens: [32]
  precisions: [fp32, bf16, fp16]
  modes: [eager, cuda_graph]
  new_tokens: 64
  warmup: 2
  iters: 5
YAML
  echo "+ $WORKER $WORK/generate.yaml"
  "$WORKER" "$WORK/generate.yaml" --runs-dir "$WORK/runs" > "$WORK/generate.log" 2>&1 ||
    { tail -20 "$WORK/generate.log"; exit 1; }
  for p in fp32 bf16 fp16; do
    echo "+ generate_reference.py time --device cuda --precision $p"
    "$PY" scripts/bench/generate_reference.py time "${bpe[@]}" --model "$WORK/gpt2" --prompts "$WORK/prompts.txt" \
      --device cuda --precision "$p" --batches 1 8 --new-tokens 64 --repeats 5 > "$WORK/generate_ref_$p.json"
  done
  "$PY" - "$WORK/runs/generate_cells/benchmark.csv" "$WORK" > "$WORK/generate.json" <<'PY'
import csv, json, sys
cells = list(csv.DictReader(open(sys.argv[1])))
ref = {p: json.load(open(f"{sys.argv[2]}/generate_ref_{p}.json")) for p in ("fp32", "bf16", "fp16")}
print(json.dumps({"cells": cells, "hf": ref}))
PY
  record generate "$WORK/generate.json"
}

profile() {
  local config
  for config in bf16 fp32_tf32; do
    local args=(--device cuda --preset base --seq 128 --batch 64 --steps 40 --threads 4
                --precision "${config%_tf32}" --profile "$WORK/profile_$config")
    [[ $config == *_tf32 ]] && args+=(--tf32)
    echo "+ scripts/bench/train_step_vs_pytorch.sh ${args[*]}"
    scripts/bench/train_step_vs_pytorch.sh "${args[@]}"
    cp "$WORK/profile_$config/profile.txt" "$OUT/profile_$config.txt"
    head -n 40 "$OUT/profile_$config.txt"
  done
}

machine
for s in "${SECTIONS[@]}"; do
  case "$s" in
    finetune) finetune ;; datawait) datawait ;; inference) inference ;; sorted) sorted_gain ;;
    generate) generate ;; profile) profile ;;
  esac
done
"$PY" scripts/gpu/performance_tables.py "$RESULTS" > "$OUT/performance.md"
cat "$OUT/performance.md"
