#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything, prepares the data and
# runs every test (gtest suites, the Hugging Face / PyTorch reference tests, the
# end-to-end worker tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" scripts/prepare_data.py
cd build
ctest --output-on-failure -j2 --timeout 900 "$@"
