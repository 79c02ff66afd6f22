#!/usr/bin/env bash
# One lent-GPU call that gathers the facts docs/performance.md starts from, in priority
# order and within a deadline, so a short lease returns something useful even when a
# step runs long. Run it from the repository root on the GPU machine, with .gpu-bundle
# carried (scripts/gpu/bundle.sh makes it):
#   scripts/gpu/one_call.sh [--deadline SECONDS] [--skip-build] [--no-tests] [--spread N]
#                           [--tests REGEX] [--target T]... [--plan STEP,STEP...]
#                           [--hf-seconds N]
# First, always: build_and_test.sh --only gpu: unpack, configure, build, `ctest -L gpu -V`
# (3 at a time, each at most 200 s); --skip-build reuses build-gpu/, --no-tests skips
# the tests, --tests runs only those matching REGEX, --target builds only the ninja
# targets named (the worker is needed by every step below, so name it too). Then the
# steps of --plan (default profile,spread), in the order given, each
# started only if the time left allows its estimate. Every timed step is the bf16 train
# step of bert-base, seq 128, batch 64 (scripts/bench/train_step_vs_pytorch.sh), with the
# fused kernels at their default (model.fused_kernels: auto, on), next to PyTorch eager:
#   profile   ours eager, profiled (Kineto, 5 steps), with the kernel table;
#   spread    N pairs (--spread, default 3): eager and whole-step CUDA graphs
#             (train.cuda_graph: true) in turn;
#   graphed   N graphed runs alone;
#   compile   one graphed run next to torch.compile(mode="reduce-overhead") too;
#   realdata  the worker fine-tuning on topics (real texts tokenized on the fly, 4
#             loader threads, bf16, batch 64, 2 epochs of 172 steps), eager then graphed, for the
#             epoch's mean step against the synthetic one;
#   packed    the same graphed, padded (model.unpad: auto) then with the batches packed
#             on the host and attended by the varlen kernel (model.unpad: always), both
#             into realdata.txt;
#   weights   scripts/gpu/bf16_weights_vs_autocast.py: PyTorch's own graphed step with
#             autocast's weight casts against bf16 weights with fp32 masters;
#   fused     N pairs of graphed runs: without and with the fused kernels
#             (model.fused_kernels: false, then true) in turn, the worker alone (no
#             PyTorch run).
#   masters   N pairs of graphed runs of the worker alone: autocast's casts of fp32
#             weights, then bf16 weights with fp32 masters (train.bf16_weights), in turn.
#   latency   batch-1 latency of bert-base at seq 128: a benchmark job's cells (fp32,
#             bf16 and fp16; eager and CUDA graphs), run with runtime.weight_casts
#             each_pass, then once, then once with model.fused_kernels: true, which
#             also times batch 128 (their benchmark.csv rows in spread.txt).
#   hftrainer the end-to-end fine-tune against Hugging Face Trainer on this GPU
#             (scripts/bench/finetune_vs_hf_trainer.sh): topics, bert-base started by
#             both sides from one fresh Hugging Face folder, bf16, batch 64, 2 epochs
#             with a dev evaluation and a checkpoint after each; the worker with
#             whole-step CUDA graphs; Trainer with bf16=True and group_by_length, then
#             with torch_compile=True as well, then with its default (random) sampler;
#             one run each, all within --hf-seconds (default 300) and the deadline (a
#             run still going then is killed and shown as timed out) (hftrainer.txt).
# nvidia-smi samples the SM clock, power and throttle reasons every 200 ms throughout.
# $OUT receives (the lease returns at most 8 files, so a plan names at most two of
# profile, realdata and hftrainer): summary.txt (one line per step), facts.txt,
# ctest-gpu.log, profile_bf16.txt, spread.txt (every run's figures and the medians, and
# the weights step's output), realdata.txt, hftrainer.txt, clocks.csv, and logs.tar.gz
# (build logs, each run's JSON, steps.jsonl and logs, the latency CSVs, hftrainer.json).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
DEADLINE=540 SKIP_BUILD=0 SPREAD=3 ONLY=gpu PLAN=profile,spread HF_SECONDS=300
BUILD_EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --deadline|--spread|--hf-seconds)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "one_call.sh: $1 needs a whole number (--deadline, --hf-seconds: seconds; --spread: pairs)" >&2; exit 2; }
      case $1 in --deadline) DEADLINE=$2 ;; --spread) SPREAD=$2 ;; *) HF_SECONDS=$2 ;; esac
      shift 2 ;;
    --plan)
      [[ $# -ge 2 && "$2" =~ ^(profile|spread|graphed|compile|realdata|packed|weights|masters|fused|latency|hftrainer)(,(profile|spread|graphed|compile|realdata|packed|weights|masters|fused|latency|hftrainer))*$ ]] ||
        { echo "one_call.sh: --plan needs a comma-separated list of profile, spread, graphed, compile, realdata, packed, weights, masters, fused, latency and hftrainer" >&2; exit 2; }
      PLAN=$2; shift 2 ;;
    --tests|--target)
      [[ $# -ge 2 && -n "$2" ]] || { echo "one_call.sh: $1 needs a value" >&2; exit 2; }
      if [[ $1 == --tests ]]; then BUILD_EXTRA+=(-R "$2"); else BUILD_EXTRA+=(--target "$2"); fi
      shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;; --no-tests) ONLY=none; shift ;;
    -h|--help) sed -n '2,49p' "$0"; exit 0 ;;
    *) echo "one_call.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
SUMMARY=$OUT/summary.txt
START=$SECONDS
note() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*" | tee -a "$SUMMARY"; }
fits() { (( SECONDS - START + $1 <= DEADLINE )); }  # fits ESTIMATED_SECONDS
finish() {
  [[ -n "${SMI_PID:-}" ]] && kill "$SMI_PID" 2> /dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2> /dev/null
  note "done"
}
trap finish EXIT

# 1. Build and the gpu tests.
BUILD_ARGS=(--only "$ONLY" "${BUILD_EXTRA[@]}")
[[ $SKIP_BUILD -eq 1 ]] && BUILD_ARGS+=(--skip-build)
note "build_and_test.sh ${BUILD_ARGS[*]}"
OUT=$LOGS/build TY_GPU_TEST_TIMEOUT=200 TY_GPU_TEST_JOBS=3 scripts/gpu/build_and_test.sh "${BUILD_ARGS[@]}" > "$LOGS/build_and_test.out" 2>&1
note "build_and_test.sh exit $?"
cat "$LOGS/build/summary.txt" >> "$SUMMARY" 2> /dev/null
cp "$LOGS/build/facts.txt" "$OUT/" 2> /dev/null
cp "$LOGS/build/ctest-gpu.log" "$OUT/" 2> /dev/null
grep -E '^ *[0-9]+/[0-9]+ Test +#' "$OUT/ctest-gpu.log" 2> /dev/null | tee -a "$SUMMARY"
[[ -x build-gpu/bin/worker ]] || { note "no worker was built: stopping"; exit 1; }
# shellcheck disable=SC1091
source build-gpu/env.sh
export TRAINYARD_BIN=$PWD/build-gpu/bin TRAINYARD_PYTHON=${TRAINYARD_PYTHON:-$(command -v python3)}

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > "$OUT/clocks.csv" 2>&1 &
SMI_PID=$!

STEP=(--device cuda --preset base --seq 128 --batch 64 --steps 60 --threads 4 --precision bf16)
pair() {  # NAME EXTRA-ARGS...: one worker run and its PyTorch eager reference
  local name=$1; shift
  local t0=$SECONDS
  echo "--- $name (clock $((SECONDS - START)) s): train_step_vs_pytorch.sh ${STEP[*]} $*" >> "$OUT/spread.txt"
  if scripts/bench/train_step_vs_pytorch.sh "${STEP[@]}" --json "$LOGS/$name.json" "$@" > "$LOGS/$name.out" 2>&1; then
    cat "$LOGS/$name.out" >> "$OUT/spread.txt"
  else
    echo "FAILED:"; tail -n 30 "$LOGS/$name.out"
  fi >> "$OUT/spread.txt"
  note "$name: $((SECONDS - t0)) s"
}

# The real-data fine-tune: topics as the worker reads it, on the fly, eager or graphed.
realdata() {  # GRAPH(true|false) [UNPAD(auto|always)]
  local unpad=${2:-auto}
  local name=realdata_$([[ $1 == true ]] && echo graphed || echo eager)$([[ $unpad == always ]] && echo _packed) t0=$SECONDS
  cat > "$LOGS/$name.yaml" <<YAML
name: $name
data:
  train: $PWD/data/prepared/topics/train.tsv
  labels: $PWD/data/prepared/topics/labels.txt
  max_seq_len: 128
  loader_threads: 4
  tokenizer: {vocab: $PWD/data/prepared/topics/vocab.txt}
model: {preset: base, unpad: $unpad}
train: {epochs: 2, batch_size: 64, precision: bf16, cuda_graph: $1}
runtime: {device: cuda, threads: 4}
log: {steps_every: 10, progress: false}
YAML
  {
    echo "--- $name (clock $((SECONDS - START)) s): worker $name.yaml (topics, 2 epochs, bf16, batch 64, cuda_graph $1, unpad $unpad)"
    if build-gpu/bin/worker "$LOGS/$name.yaml" --runs-dir "$LOGS/runs" --resume none > "$LOGS/$name.out" 2>&1; then
      cat "$LOGS/runs/$name/epochs.csv"
      cp "$LOGS/runs/$name/epochs.csv" "$LOGS/$name.epochs.csv"
      cp "$LOGS/runs/$name/steps.jsonl" "$LOGS/$name.steps.jsonl"
    else
      echo "FAILED:"; tail -n 30 "$LOGS/$name.out"
    fi
  } >> "$OUT/realdata.txt"
  rm -rf "$LOGS/runs"  # its checkpoint (bert-base, 440 MB) stays behind
  note "$name: $((SECONDS - t0)) s"
}

# Batch-1 latency, bert-base at seq 128, every precision and both forward modes, with
# the frozen weights cast by autocast on every pass or once, and the fused add+norm
# kernels off or on (auto leaves them off outside training); BATCHES adds batch sizes.
latency() {  # WEIGHT_CASTS(each_pass|once) FUSED(false|true) [BATCHES, e.g. "1, 128"]
  local name=latency_$1 t0=$SECONDS batches=${3:-1}
  [[ $2 == true ]] && name+=_fused
  cat > "$LOGS/$name.yaml" <<YAML
name: $name
kind: benchmark
data:
  train: $PWD/data/prepared/langid/train.tsv
  tokenizer: {vocab: $PWD/data/prepared/langid/vocab.txt}
model: {preset: base, fused_kernels: $2}
benchmark: {batch_sizes: [$batches], seq_lens: [128], precisions: [fp32, bf16, fp16], modes: [eager, cuda_graph], warmup: 20, iters: 300}
runtime: {device: cuda, weight_casts: $1}
log: {progress: false}
YAML
  {
    echo "--- $name (clock $((SECONDS - START)) s): worker $name.yaml (bert-base, batch $batches, seq 128, runtime.weight_casts $1, model.fused_kernels $2)"
    if build-gpu/bin/worker "$LOGS/$name.yaml" --runs-dir "$LOGS/runs" --resume none > "$LOGS/$name.out" 2>&1; then
      cat "$LOGS/runs/$name/benchmark.csv"
      cp "$LOGS/runs/$name/benchmark.csv" "$LOGS/$name.csv"
    else
      echo "FAILED:"; tail -n 30 "$LOGS/$name.out"
    fi
  } >> "$OUT/spread.txt"
  rm -rf "$LOGS/runs"
  note "$name: $((SECONDS - t0)) s"
}

# The fine-tune against HF Trainer, given --hf-seconds at most, within what is left of the deadline.
hftrainer() {
  local t0=$SECONDS left=$((DEADLINE - (SECONDS - START) - 10))
  ((left > HF_SECONDS)) && left=$HF_SECONDS
  echo "--- hftrainer (clock $((SECONDS - START)) s, ${left} s left): topics, bert-base, bf16, batch 64, 2 epochs" >> "$OUT/hftrainer.txt"
  scripts/bench/finetune_vs_hf_trainer.sh --tasks topics --runs 1 --epochs 2 --batch 64 --threads 4 \
    --device cuda --precision bf16 --cuda-graph --preset base --lr 1e-4 --loader-threads 4 --init-preset \
    --systems hf_grouped,hf_compiled,hf_default --deadline "$left" --json "$LOGS/hftrainer.json" >> "$OUT/hftrainer.txt" 2>&1
  note "hftrainer: exit $?, $((SECONDS - t0)) s"
}

IFS=, read -r -a STEPS_PLANNED <<< "$PLAN"
for step in "${STEPS_PLANNED[@]}"; do
  case "$step" in
    profile)
      if fits 90; then
        pair profiled --profile "$LOGS/profile_bf16"
        cp "$LOGS/profile_bf16/profile.txt" "$OUT/profile_bf16.txt" 2> /dev/null
      fi ;;
    spread)
      for ((i = 1; i <= SPREAD; ++i)); do
        fits 50 && pair "eager_$i"
        fits 50 && pair "graphed_$i" --cuda-graph
      done ;;
    graphed)
      for ((i = 1; i <= SPREAD; ++i)); do fits 45 && pair "graphed_$i" --cuda-graph; done ;;
    compile) fits 100 && pair compiled --cuda-graph --compile-mode reduce-overhead ;;
    fused)
      for ((i = 1; i <= SPREAD; ++i)); do
        fits 15 && pair "unfused_$i" --cuda-graph --unfused --no-reference
        fits 15 && pair "fused_$i" --cuda-graph --fused --no-reference
      done ;;
    masters)
      for ((i = 1; i <= SPREAD; ++i)); do
        fits 15 && pair "autocast_$i" --cuda-graph --no-reference
        fits 15 && pair "masters_$i" --cuda-graph --bf16-weights --no-reference
      done ;;
    realdata) fits 60 && realdata false; fits 60 && realdata true ;;
    packed) fits 60 && realdata true; fits 60 && realdata true always ;;
    hftrainer) fits 120 && hftrainer ;;
    latency) fits 25 && latency each_pass false; fits 25 && latency once false; fits 40 && latency once true "1, 128" ;;
    weights)
      if fits 60; then
        echo "--- weights (clock $((SECONDS - START)) s): scripts/gpu/bf16_weights_vs_autocast.py" >> "$OUT/spread.txt"
        mkdir -p "$LOGS/weights"
        python3 scripts/gpu/bf16_weights_vs_autocast.py --json "$LOGS/weights/result.json" >> "$OUT/spread.txt" 2>&1
        note "weights: exit $?"
      fi ;;
  esac
done

python3 - "$LOGS" >> "$OUT/spread.txt" <<'PY'
import glob, json, os, statistics, sys
rows = {"eager": [], "graphed": [], "graphed+fused": [], "graphed+bf16_weights": []}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name = os.path.basename(path)[:-5]
    r = json.load(open(path))
    if "ours_ms" not in r:  # not a train_step_vs_pytorch.sh result (hftrainer.json)
        continue
    kind = ("graphed+fused" if r.get("fused") else "graphed") if r["cuda_graph"] else "eager"
    if r.get("bf16_weights"):
        kind = "graphed+bf16_weights" if r["cuda_graph"] else "eager+bf16_weights"
        rows.setdefault(kind, [])
    rows[kind].append((name, r["ours_ms"], r["pytorch_ms"]))
    if r.get("compiled_ms"):
        print(f"{name}: ours {r['ours_ms']:.2f} ms, torch.compile({r['compile_mode']}) {r['compiled_ms']:.2f} ms, "
              f"ratio {r['ours_ms'] / r['compiled_ms']:.3f}")
print("\n=== medians (bf16, bert-base, seq 128, batch 64) ===")
for kind, runs in rows.items():
    if not runs:
        continue
    ours = [o for _, o, _ in runs]
    ref = [p for _, _, p in runs if p]
    ratios = [o / p for _, o, p in runs if p]
    spread = (max(ours) - min(ours)) / statistics.median(ours)
    line = f"{kind:13} runs {len(runs)}: ours {[round(o, 2) for o in ours]} median {statistics.median(ours):.2f} ms (spread {spread:.1%})"
    if ref:
        line += (f"; PyTorch eager {[round(p, 2) for p in ref]} median {statistics.median(ref):.2f}; "
                 f"ratio median {statistics.median(ratios):.3f}")
    print(line)
PY
tail -n 4 "$OUT/spread.txt" >> "$SUMMARY"
