#!/usr/bin/env bash
# What log.trace costs: the same 2-rank fine-tune job with the trace on and off, runs
# interleaved (off, on, off, on, ...) so that the machine's drift hits both alike. Each
# run's figure is its median ms per step after the warm-up steps (steps.jsonl); the
# script prints every run and the ratio of the medians, on over off.
#   scripts/bench/trace_overhead.sh [--runs 5] [--steps 60] [--preset tiny] [--seq 64]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=5 STEPS=60 PRESET=tiny SEQ=64 WARMUP=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;; --preset) PRESET=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;; -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if (( STEPS <= WARMUP )); then echo "error: --steps must be above the $WARMUP warm-up steps" >&2; exit 2; fi
source scripts/bench/common.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DATA=data/prepared/langid
make_long_tsv "$DATA/train.tsv" "$WORK/long.tsv" $((32 * 2 * (STEPS + 2)))

run() {  # run TRACE -> median ms per step of the timed steps
  cat > "$WORK/job.yaml" <<YAML
name: bench_trace
data:
  train: $WORK/long.tsv
  max_seq_len: $SEQ
  loader_threads: 1
  tokenizer: {vocab: $PWD/$DATA/vocab.txt}
model: {preset: $PRESET}
train: {epochs: 1, batch_size: 32, max_steps: $STEPS}
runtime: {device: cpu, threads: 1}
log: {steps_every: 1, progress: false, trace: $1, trace_steps: 100}
YAML
  mpirun -n 2 --oversubscribe --bind-to none "$WORKER" "$WORK/job.yaml" --runs-dir "$WORK/runs" --resume none \
    > "$WORK/worker.log" 2>&1 || { cat "$WORK/worker.log"; exit 1; }
  if [[ $1 == true ]]; then [[ -s $WORK/runs/bench_trace/trace.json ]] || { echo "no trace.json" >&2; exit 1; }; fi
  "$PY" -c "
import json
ms = sorted(json.loads(l)['ms'] for l in list(open('$WORK/runs/bench_trace/steps.jsonl'))[$WARMUP:])
print(f'{ms[len(ms) // 2]:.2f}')"
}

off=() on=()
for ((i = 1; i <= RUNS; i++)); do
  off+=("$(run false)")
  on+=("$(run true)")
  echo "run $i: trace off ${off[-1]} ms/step, on ${on[-1]} ms/step"
done
"$PY" - "${off[*]}" "${on[*]}" "$PRESET" "$SEQ" "$STEPS" <<'PY'
import statistics, sys
off, on = (sorted(float(x) for x in s.split()) for s in sys.argv[1:3])
m_off, m_on = statistics.median(off), statistics.median(on)
print(f"log.trace, 2 ranks, {sys.argv[3]} preset, batch 32 x seq {sys.argv[4]}, {sys.argv[5]} steps, "
      f"median of {len(off)} runs each:")
print(f"  off {m_off:.2f} ms/step   on {m_on:.2f} ms/step   on/off {m_on / m_off:.4f} "
      f"({100 * (m_on / m_off - 1):+.2f}%)")
PY
