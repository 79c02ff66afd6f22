#!/usr/bin/env bash
# Training-step benchmark: the C++ worker vs a plain PyTorch loop over Hugging Face
# BertForSequenceClassification, same preset, batch, sequence length, data, optimizer
# (AdamW + clipping), precision and thread count, in one run. Every batch is exactly
# batch x seq tokens (texts are joined fortunes long enough to be cut at seq), so both
# sides do identical work. Prints both ms/step figures and their ratio.
#   scripts/bench/train_step_vs_pytorch.sh [--preset mini] [--batch 32] [--seq 128]
#     [--steps 40] [--threads 2] [--precision fp32|bf16|fp16] [--device cpu|cuda]
#     [--tf32] [--compile] [--compile-mode MODE] [--cuda-graph] [--fused|--unfused] [--bf16-weights]
#     [--no-reference] [--json FILE] [--profile DIR]
# --tf32 allows TF32 matrix products on both sides; --compile adds a second reference
# run under torch.compile (--compile-mode: its mode, e.g. reduce-overhead, which
# replays CUDA graphs; default torch's default). --cuda-graph runs the worker's steps
# as whole-step CUDA graphs (train.cuda_graph: true; CUDA only). The worker's fused
# CUDA kernels follow model.fused_kernels' default, auto (on for this step on CUDA);
# --fused asks for them (true; CUDA only), --unfused turns them off. --bf16-weights
# keeps the worker's linear layers' weights in bf16 with fp32 masters in AdamW
# (train.bf16_weights; --precision bf16 only; the reference stays autocast). --no-reference
# times the worker alone (pytorch_ms null in the JSON), to compare worker settings
# quickly. On CUDA both sides
# time each step with CUDA events and the
# worker reads them once per 10 steps (its logging interval), so the figures are
# medians over the logged steps; on CPU they are means over every step after warm-up.
# The worker's figure is its whole step, data wait included, and its median data wait is
# printed beside it. Its loader gets 4 threads on CUDA (1 on CPU): a graphed step of
# bert-base takes about 20 ms on an H100, less than one thread takes to tokenize a batch
# of these long texts, and the reference tokenizes before it starts timing.
# --json writes the figures (and the model's non-embedding parameter count) to FILE.
# --profile runs the worker once more, after the timed runs, with a Kineto window of 5
# steps after warm-up (log.profile_steps), and copies its profile.txt (operators by self
# time; on CUDA with the kernels' device time) and profile.json (a Chrome trace) to DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
PRESET=mini BATCH=32 SEQ=128 STEPS=40 THREADS=2 PRECISION=fp32 DEVICE=cpu TF32=false COMPILE=false JSON="" PROFILE_DIR=""
COMPILE_MODE=default GRAPH=false FUSED=auto REFERENCE=true BF16_WEIGHTS=false
WARMUP=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;; --seq) SEQ=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;; --precision) PRECISION=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;; --tf32) TF32=true; shift ;; --compile) COMPILE=true; shift ;;
    --json) JSON=$2; shift 2 ;; --profile) PROFILE_DIR=$2; shift 2 ;;
    --compile-mode) COMPILE=true COMPILE_MODE=$2; shift 2 ;; --cuda-graph) GRAPH=true; shift ;;
    --fused) FUSED=true; shift ;; --unfused) FUSED=false; shift ;; --no-reference) REFERENCE=false; shift ;;
    --bf16-weights) BF16_WEIGHTS=true; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cpu|cuda) ;; *) echo "error: --device $DEVICE: expected cpu or cuda" >&2; exit 2 ;; esac
case "$PRECISION" in fp32|bf16|fp16) ;; *) echo "error: --precision $PRECISION: expected fp32, bf16 or fp16" >&2; exit 2 ;; esac
if [[ $GRAPH == true && $DEVICE != cuda ]]; then echo "error: --cuda-graph needs --device cuda" >&2; exit 2; fi
if [[ $FUSED == true && $DEVICE != cuda ]]; then echo "error: --fused needs --device cuda" >&2; exit 2; fi
if [[ $BF16_WEIGHTS == true && $PRECISION != bf16 ]]; then echo "error: --bf16-weights needs --precision bf16" >&2; exit 2; fi
if [[ $DEVICE == cuda ]]; then WARMUP=10 STEPS_EVERY=10 LOADERS=4; else STEPS_EVERY=1 LOADERS=1; fi
if (( STEPS <= WARMUP )); then
  echo "error: --steps $STEPS: must be above the $WARMUP warm-up steps, which are not timed" >&2; exit 2
fi
source scripts/bench/common.sh
TOPICS=data/prepared/topics
make_long_tsv "$TOPICS/train.tsv" "$WORK/long.tsv" "$((BATCH * (STEPS + 2)))"
LABELS=$(cut -f1 "$WORK/long.tsv" | tail -n +2 | sort -u | wc -l)
cat > "$WORK/job.yaml" <<YAML
name: bench_train_step
data:
  train: $WORK/long.tsv
  max_seq_len: $SEQ
  bucket_batches: 1
  loader_threads: $LOADERS
  tokenizer: {vocab: $PWD/$TOPICS/vocab.txt}
model: {preset: $PRESET, fused_kernels: $FUSED}
train: {epochs: 1, batch_size: $BATCH, max_steps: $STEPS, lr: 5.0e-4, precision: $PRECISION, bf16_weights: $BF16_WEIGHTS, cuda_graph: $GRAPH}
runtime: {device: $DEVICE, threads: $THREADS, tf32: $TF32}
log: {steps_every: $STEPS_EVERY, progress: false}
YAML
"$WORKER" "$WORK/job.yaml" --runs-dir "$WORK/runs" --resume none > "$WORK/worker.log" 2>&1 ||
  { cat "$WORK/worker.log"; exit 1; }
reference() {
  "$PY" scripts/bench/train_step_reference.py --data "$WORK/long.tsv" --vocab "$TOPICS/vocab.txt" \
    --preset "$PRESET" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" \
    --threads "$THREADS" --labels "$LABELS" --device "$DEVICE" --precision "$PRECISION" \
    $([[ $TF32 == true ]] && echo --tf32) "$@"
}
if [[ $REFERENCE == true ]]; then reference > "$WORK/ref.json"; else echo '{}' > "$WORK/ref.json"; fi
if [[ $COMPILE == true && $REFERENCE == true ]]; then reference --compile --compile-mode "$COMPILE_MODE" > "$WORK/ref_compiled.json"; else echo '{}' > "$WORK/ref_compiled.json"; fi
if [[ -n $PROFILE_DIR ]]; then  # a separate run, so the profiler's cost stays out of the timings
  sed 's/^log: {/log: {profile_steps: '"$(( STEPS - WARMUP < 5 ? STEPS - WARMUP : 5 ))"', profile_from_step: '"$((WARMUP + 1))"', /' \
    "$WORK/job.yaml" > "$WORK/profile.yaml"
  "$WORKER" "$WORK/profile.yaml" --runs-dir "$WORK/profile-runs" --resume none > "$WORK/profile.log" 2>&1 ||
    { cat "$WORK/profile.log"; exit 1; }
  mkdir -p "$PROFILE_DIR"
  cp "$WORK/profile-runs/bench_train_step/profile.txt" "$WORK/profile-runs/bench_train_step/profile.json" "$PROFILE_DIR/"
fi
"$PY" - "$WORK/runs/bench_train_step/steps.jsonl" "$WORK/ref.json" "$WORK/ref_compiled.json" "$WARMUP" "$JSON" <<PY
import json, statistics, sys
steps_file, ref_file, compiled_file, warmup, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
rows = [json.loads(l) for l in open(steps_file)]
rows = [r for r in rows if r["step"] > warmup]
ms, wait = [r["ms"] for r in rows], [r["wait_ms"] for r in rows]
cuda = "$DEVICE" == "cuda"
ours = statistics.median(ms) if cuda else sum(ms) / len(ms)
ours_wait = statistics.median(wait) if cuda else sum(wait) / len(wait)
ref, compiled = json.load(open(ref_file)), json.load(open(compiled_file))
key = "median_ms" if cuda else "ms_per_step"
print(f"train step, preset $PRESET, batch $BATCH x seq $SEQ, $PRECISION (tf32 $TF32) on $DEVICE, cuda_graph $GRAPH, fused $FUSED, "
      f"bf16_weights $BF16_WEIGHTS, $THREADS threads, steps {warmup + 1}..$STEPS ({'median' if cuda else 'mean'})")
print(f"  trainyard worker (C++)     {ours:8.2f} ms/step   of which data wait {ours_wait:.2f} ms")
if ref:
    print(f"  PyTorch + HF (Python)      {ref[key]:8.2f} ms/step   ratio ours / pytorch {ours / ref[key]:6.3f}")
if compiled:
    print(f"  PyTorch + torch.compile ($COMPILE_MODE) {compiled[key]:8.2f} ms/step   ratio ours / compiled {ours / compiled[key]:6.3f}")
if out:
    json.dump({"preset": "$PRESET", "batch": $BATCH, "seq": $SEQ, "precision": "$PRECISION", "tf32": "$TF32" == "true",
               "device": "$DEVICE", "cuda_graph": "$GRAPH" == "true", "fused": "$FUSED" == "true" or ("$FUSED" == "auto" and "$DEVICE" == "cuda"), "compile_mode": "$COMPILE_MODE", "bf16_weights": "$BF16_WEIGHTS" == "true", "ours_ms": ours, "ours_wait_ms": ours_wait, "pytorch_ms": ref.get(key),
               "compiled_ms": compiled.get(key), "non_embedding_params": ref.get("non_embedding_params")},
              open(out, "w"))
PY
