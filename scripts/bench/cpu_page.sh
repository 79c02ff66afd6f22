#!/usr/bin/env bash
# Measures this machine for docs/performance-cpu.md: runs the CPU benchmark scripts (each
# ours next to its reference in the same run), keeps their JSON in --out, and writes the
# page from it with scripts/bench/cpu_page.py (machine, date, command and commit named on
# the page). Takes about 55 minutes on two cores with the defaults; keep the machine
# otherwise idle meanwhile.
#   scripts/bench/cpu_page.sh [--out docs/measurements/cpu] [--runs 3] [--tasks langid] [--only first-day]
# --tasks goes to finetune_vs_hf_trainer.sh (langid,topics adds about 75 minutes).
# --only first-day measures the first-day settings alone (about 10 minutes:
# langid with 16 x 2 accumulated micro-batches a step, the cosine schedule, an evaluation with macro F1
# every 50 steps and the best checkpoint by it, against Trainer with the same), keeps its
# own machine and date beside the rest, and writes the page again.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=docs/measurements/cpu RUNS=3 TASKS=langid ONLY=""
COMMAND="scripts/bench/cpu_page.sh $*"  # as given, for the page
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;; --runs) RUNS=$2; shift 2 ;; --tasks) TASKS=$2; shift 2 ;;
    --only) ONLY=$2; [[ $ONLY == first-day ]] || { echo "--only: expected first-day" >&2; exit 2; }; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

step() { echo "[$(date +%H:%M:%S)] $*" >&2; }
# The machine, date, commit and command, as JSON in $1.
describe_machine() {
  "$PY" - "$1" "$COMMAND" "$RUNS" <<'PY'
import datetime, json, os, platform, re, subprocess, sys
import torch
cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
field = lambda name: next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith(name + ":")), "")
flags = field("Flags").split()
memory_kb = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1))
commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
json.dump({"date": datetime.datetime.utcnow().strftime("%Y-%m-%d"), "cpu": field("Model name"),
           "cores": os.cpu_count(), "memory_gib": round(memory_kb / 2**20), "amx": "amx_tile" in flags,
           "avx512_bf16": "avx512_bf16" in flags, "kernel": platform.release(), "torch": torch.__version__,
           "commit": commit, "command": sys.argv[2], "runs": int(sys.argv[3])},
          open(sys.argv[1], "w"), indent=1)
PY
}
# Gradient accumulation (16 x 2: the global batch of 32 the other runs use), the cosine
# schedule, an evaluation with macro F1 every 50 steps and the best checkpoint by it, on
# both sides.
first_day() {
  step "fine-tuning with the first day's settings against HF Trainer"
  describe_machine "$OUT/env_first_day.json"
  scripts/bench/finetune_vs_hf_trainer.sh --tasks langid --runs "$RUNS" --systems hf_grouped --batch 16 \
    --accumulation 2 --schedule cosine --eval-steps 50 --best-metric f1 --json "$OUT/finetune_first_day.json" \
    > /dev/null
}
if [[ $ONLY == first-day ]]; then
  first_day
  "$PY" scripts/bench/cpu_page.py --measurements "$OUT" --out docs/performance-cpu.md
  step "wrote docs/performance-cpu.md from $OUT"
  exit 0
fi
rm -f "$OUT"/*.json
step "machine"
describe_machine "$OUT/env.json"
for R in $(seq "$RUNS"); do
  step "inference, run $R of $RUNS"
  scripts/bench/inference_vs_pytorch.sh --json "$OUT/inference_$R.json" > /dev/null
done
step "generation"
scripts/bench/generate_vs_hf.sh --repeats "$RUNS" --json "$OUT/generate.json" > /dev/null
step "the decode-step product"
scripts/bench/gemv_vs_mkl.sh --json "$OUT/gemv.json" > /dev/null
step "precisions"
LANGID=$PWD/data/prepared/langid
cat > "$WORK/precision.yaml" <<YAML
name: precision
kind: benchmark
data:
  train: $LANGID/train.tsv
  tokenizer: {vocab: $LANGID/vocab.txt}
model: {preset: mini}
benchmark: {batch_sizes: [8], seq_lens: [128], precisions: [fp32, bf16], warmup: 3, iters: 20}
runtime: {device: cpu, threads: 2}
YAML
for R in $(seq "$RUNS"); do
  "$WORKER" "$WORK/precision.yaml" --runs-dir "$WORK/runs_$R" > "$WORK/precision.log" 2>&1 ||
    { cat "$WORK/precision.log"; exit 1; }
done
"$PY" - "$WORK" "$OUT/precision.json" <<'PY'
import csv, glob, json, statistics, sys
runs = [list(csv.DictReader(open(p))) for p in sorted(glob.glob(sys.argv[1] + "/runs_*/precision/benchmark.csv"))]
ms = {p: statistics.median(float(c["mean_ms"]) for r in runs for c in r if c["precision"] == p) for p in ("fp32", "bf16")}
json.dump({"preset": "mini", "batch": 8, "seq": 128, "threads": 2, "runs": len(runs), "mean_ms": ms},
          open(sys.argv[2], "w"), indent=1)
PY
step "fine-tuning against HF Trainer ($TASKS)"
scripts/bench/finetune_vs_hf_trainer.sh --tasks "$TASKS" --runs "$RUNS" --json "$OUT/finetune.json" > /dev/null
first_day
"$PY" scripts/bench/cpu_page.py --measurements "$OUT" --out docs/performance-cpu.md
step "wrote docs/performance-cpu.md from $OUT"
