#!/usr/bin/env bash
# Preemption benchmark: a langid fine-tune (configs/jobs/langid_tiny.yaml) on a 2-rank
# pool is preempted by a priority-10 job; prints the time from the stop request to the
# victim's ranks being free and to the urgent job running, and the steps the victim runs
# again, against a requeue from its last periodic checkpoint. Medians of --runs.
#   scripts/bench/preemption.sh [--runs 3] [--keep]
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in -h|--help) sed -n '2,6p' "$0"; exit 0 ;; esac
PY="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python"
[[ -x build/bin/worker && -x build/bin/coordinator && -x build/bin/jobctl ]] ||
  scripts/build.sh worker coordinator jobctl
"$PY" scripts/prepare_data.py > /dev/null
exec "$PY" scripts/bench/preemption.py "$@"
