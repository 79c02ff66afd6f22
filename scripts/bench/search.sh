#!/usr/bin/env bash
# Search benchmark: an ASHA search of 12 langid trials on a 2-rank pool, its coordinator
# killed and restarted midway, against the same 12 trials run to the end (those it stopped
# run again). Prints each trial's decision, the best accuracy of each and the rank-seconds
# of each, with their ratio (tests/coordinator/search_test.py asha, which also asserts
# them, at 64 tokens a text; the test itself runs 32). About 4 minutes a run.
#   scripts/bench/search.sh [--runs 1]
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in -h|--help) sed -n '2,7p' "$0"; exit 0 ;; esac
runs=1
[[ "${1:-}" == "--runs" ]] && runs="$2"
PY="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python"
[[ -x build/bin/worker && -x build/bin/coordinator && -x build/bin/jobctl ]] ||
  scripts/build.sh worker coordinator jobctl
"$PY" scripts/prepare_data.py > /dev/null
echo "$(date -u '+%Y-%m-%d') on $(hostname): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for run in $(seq "$runs"); do
  echo "run $run of $runs"
  "$PY" tests/coordinator/search_test.py --coordinator build/bin/coordinator --jobctl build/bin/jobctl \
    --worker build/bin/worker --mpirun mpirun asha --max-seq-len 64 | grep -E '^(figures:|  trial|killed)'
done
