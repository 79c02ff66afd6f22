#!/usr/bin/env bash
# The decode-step product, one run: worker/kernels/gemv.h's RowsTimesWeight against
# at::addmm (MKL) on GPT-2 small's block weights (12 layers of c_attn, attn.c_proj,
# mlp.c_fc, mlp.c_proj; 340 MB, so every pass reads them from memory, as a decode step
# does), for x of 1 to 32 rows, the same threads. Prints ms per pass, medians of --runs
# processes (each already a median of 9 passes), and the ratio ours / addmm. --json FILE
# also writes the figures there (scripts/bench/cpu_page.sh).
#   scripts/bench/gemv_vs_mkl.sh [--threads 2] [--runs 5] [--rows 1,2,4,8,16,32] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=2 RUNS=5 ROWS=1,2,4,8,16,32 JSON=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;; --runs) RUNS=$2; shift 2 ;; --rows) ROWS=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;; -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
PROBE="$BIN/ty_probe"
[[ -x $PROBE ]] || scripts/build.sh ty_probe
for R in $(seq "$RUNS"); do "$PROBE" gemv --threads "$THREADS" --rows "$ROWS" > "$WORK/run_$R.json"; done
"$PY" - "$WORK" "$JSON" <<PY
import glob, json, statistics, sys
runs = [json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/run_*.json"))]
result = {"threads": $THREADS, "runs": $RUNS, "weights_mb": 340, "rows": []}
print("x rows times GPT-2 small's block weights (340 MB fp32), $THREADS threads; ms per pass,")
print("medians of $RUNS runs")
print(f"{'rows':>4} {'ours ms':>8} {'addmm ms':>9} {'ours/addmm':>11} {'ours GB/s':>10}")
for i, cell in enumerate(runs[0]):
    ours = statistics.median(r[i]["ours_ms"] for r in runs)
    addmm = statistics.median(r[i]["addmm_ms"] for r in runs)
    print(f"{cell['rows']:>4} {ours:8.1f} {addmm:9.1f} {ours / addmm:11.2f} {340.0 / ours:10.1f}")
    result["rows"].append({"rows": cell["rows"], "ours_ms": ours, "addmm_ms": addmm})
if sys.argv[2]:
    json.dump(result, open(sys.argv[2], "w"), indent=1)
PY
