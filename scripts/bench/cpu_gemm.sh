#!/usr/bin/env bash
# The products of one BERT layer of width --hidden over --tokens rows, forward and
# backward (dL/dx), through worker/kernels/packed_linear.h (oneDNN on a weight
# reordered once: what runtime.cpu_gemm: onednn runs) and through torch::linear (ATen's
# MKL sgemm: runtime.cpu_gemm: mkl), the same inputs and threads, in one process per
# run. Prints ms per product, medians of --runs runs, the ratio and GFLOP/s: which
# setting suits this CPU.
#   scripts/bench/cpu_gemm.sh [--threads 2] [--runs 5] [--tokens 4096] [--hidden 256]
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=2 RUNS=5 TOKENS=4096 HIDDEN=256
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;; --runs) RUNS=$2; shift 2 ;; --tokens) TOKENS=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;; -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
PROBE="$BIN/ty_probe"
[[ -x $PROBE ]] || scripts/build.sh ty_probe
for R in $(seq "$RUNS"); do
  "$PROBE" gemm --threads "$THREADS" --tokens "$TOKENS" --hidden "$HIDDEN" > "$WORK/run_$R.json"
done
"$PY" - "$WORK" <<PY
import glob, json, statistics, sys
runs = [json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/run_*.json"))]
print("One BERT layer's fp32 products, width $HIDDEN, $TOKENS rows, $THREADS threads; ms, medians of $RUNS runs")
print(f"{'product':>13} {'m x k x n':>18} {'oneDNN ms':>10} {'MKL ms':>8} {'oneDNN/MKL':>11} {'oneDNN GF/s':>12} {'MKL GF/s':>9}")
total_ours = total_mkl = 0.0
for i, cell in enumerate(runs[0]):
    ours = statistics.median(r[i]["onednn_ms"] for r in runs)
    mkl = statistics.median(r[i]["mkl_ms"] for r in runs)
    total_ours, total_mkl = total_ours + ours, total_mkl + mkl
    gflop = 2 * cell["m"] * cell["k"] * cell["n"] / 1e9
    shape = f"{cell['m']}x{cell['k']}x{cell['n']}"
    print(f"{cell['product']:>13} {shape:>18} {ours:10.2f} {mkl:8.2f} {ours / mkl:11.2f} {gflop / ours * 1e3:12.0f} {gflop / mkl * 1e3:9.0f}")
print(f"{'all':>13} {'':>18} {total_ours:10.2f} {total_mkl:8.2f} {total_ours / total_mkl:11.2f}")
PY
