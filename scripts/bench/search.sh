#!/usr/bin/env bash
# Search benchmark: an ASHA search of 12 langid trials on a 2-rank pool, its coordinator
# killed and restarted midway, against the same 12 trials run to the end (those it stopped
# run again). Prints each trial's decision, the best accuracy of each and the rank-seconds
# of each, with their ratio (tests/coordinator/search_test.py asha --reference, which also
# asserts what the decisions are worth against the full runs, at 64 tokens a text; ctest
# runs the search alone, at 32). About 8 minutes a run on two cores. --record CSV writes
# the last run's full runs' metrics (tests/coordinator/data/asha_langid_full_runs.csv is
# one such recording).
#   scripts/bench/search.sh [--runs 1] [--record CSV]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=1
record=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    --runs) runs="$2"; shift 2 ;;
    --record) record=(--record "$(realpath -m "$2")"); shift 2 ;;
    *) echo "search.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PY="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python"
[[ -x build/bin/worker && -x build/bin/coordinator && -x build/bin/jobctl ]] ||
  scripts/build.sh worker coordinator jobctl
"$PY" scripts/prepare_data.py > /dev/null
echo "$(date -u '+%Y-%m-%d') on $(hostname): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for run in $(seq "$runs"); do
  echo "run $run of $runs"
  "$PY" tests/coordinator/search_test.py --coordinator build/bin/coordinator --jobctl build/bin/jobctl \
    --worker build/bin/worker --mpirun mpirun asha --trials 12 --examples 1500 --max-seq-len 64 --epochs 9 --reference "${record[@]}" |
    grep -E '^(figures:|  trial|killed|recorded)'
done
