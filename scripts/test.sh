#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything, prepares the data and
# runs every test (gtest suites, the Hugging Face / PyTorch reference tests, the
# end-to-end worker, pool and MPI tests; the gpu-labelled tests report themselves as
# skipped without a GPU).
#   scripts/test.sh                 everything
#   scripts/test.sh --quick         the unit and reference tests only (about 2 minutes once built)
#   scripts/test.sh [--quick] ARGS  extra arguments go to ctest (e.g. -R ddp_ or -L mpi)
# TRAINYARD_WERROR=1 builds with -Werror (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
LABELS=()
if [[ ${1:-} == --quick ]]; then
  LABELS=(-L 'unit|reference')
  shift
elif [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,9p' "$0"
  exit 0
fi
scripts/setup.sh
scripts/build.sh
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" scripts/prepare_data.py
cd build
ctest --output-on-failure -j2 --timeout 900 "${LABELS[@]}" "$@"
