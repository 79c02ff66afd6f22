#!/usr/bin/env bash
# Configures and builds Trainyard into build/ (binaries in build/bin/). Assumes
# scripts/setup.sh has run. Usage: scripts/build.sh [ninja targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${TRAINYARD_BUILD_JOBS:-2}"
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > build.configure.log 2>&1 ||
    { cat build.configure.log; exit 1; }
  mv build.configure.log build/configure.log
fi
ninja -C build -j"$JOBS" "$@"
