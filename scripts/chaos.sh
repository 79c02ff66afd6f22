#!/usr/bin/env bash
# Chaos soak (tests/chaos/chaos_soak.py; ctest runs it for 60 s as chaos_soak): small
# real jobs on two worker pools while ranks and the coordinator are killed (-9), stopped
# and continued, and jobs cancelled; then checks that
# every acknowledged job ended exactly once, each epoch is logged once, nothing is stuck,
# memory stayed bounded and no job outside a victim's own job failed.
#   scripts/chaos.sh [--minutes 15] [--seed N] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bin/worker && -x build/bin/coordinator && -x build/bin/jobctl ]] ||
  scripts/build.sh worker coordinator jobctl
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" scripts/prepare_data.py > /dev/null
exec "${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" tests/chaos/chaos_soak.py "$@"
