#!/usr/bin/env bash
# Configures and builds Trainyard into build/ (binaries in build/bin/). Assumes
# scripts/setup.sh has run. Usage: scripts/build.sh [ninja targets...]
# TRAINYARD_WERROR=1 turns compiler warnings into errors; TRAINYARD_BUILD_JOBS sets the
# parallelism (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${TRAINYARD_BUILD_JOBS:-2}"
WERROR=OFF
[[ ${TRAINYARD_WERROR:-0} == 1 ]] && WERROR=ON
if [[ ! -f build/build.ninja ]] || ! grep -q "TRAINYARD_WERROR:BOOL=$WERROR" build/CMakeCache.txt; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINYARD_WERROR=$WERROR > build.configure.log 2>&1 ||
    { cat build.configure.log; exit 1; }
  mv build.configure.log build/configure.log
fi
ninja -C build -j"$JOBS" "$@"
