#!/usr/bin/env bash
# Dispatch benchmark: 1,000 minimal real jobs (tiny model, one step, 1 rank each)
# through the coordinator onto a 2-rank worker pool; prints submit->running latency
# p50/p99 and sustained jobs/s. With --slurm, also the same count of trivial sbatch jobs
# on a throw-away local Slurm (Debian's slurm-wlm, if installed) and the ratios.
#   scripts/bench/dispatch.sh [--jobs 1000] [--ranks 2] [--submitters 4] [--slurm] [--keep]
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in -h|--help) sed -n '2,6p' "$0"; exit 0 ;; esac
PY="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python"
[[ -x build/bin/worker && -x build/bin/coordinator && -x build/bin/jobctl ]] ||
  scripts/build.sh worker coordinator jobctl
"$PY" scripts/prepare_data.py > /dev/null
exec "$PY" scripts/bench/dispatch.py "$@"
