#!/usr/bin/env bash
# Builds the torch-free targets with AddressSanitizer and UndefinedBehaviorSanitizer
# (or TRAINYARD_SANITIZE=thread) into build-sanitize/ and runs their unit suites: the
# job spec, data, coordinator and common suites, and everything that parses bytes
# from files or the wire. Assumes scripts/setup.sh has run.
#   scripts/test_sanitized.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
SANITIZE="${TRAINYARD_SANITIZE:-address,undefined}"
BUILD="build-sanitize-${SANITIZE//,/-}"
WERROR=OFF
[[ ${TRAINYARD_WERROR:-0} == 1 ]] && WERROR=ON
if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTRAINYARD_WITH_TORCH=OFF \
    -DTRAINYARD_SANITIZE="$SANITIZE" -DTRAINYARD_WERROR=$WERROR > "$BUILD.configure.log" 2>&1 ||
    { cat "$BUILD.configure.log"; exit 1; }
  mv "$BUILD.configure.log" "$BUILD/configure.log"
fi
ninja -C "$BUILD" -j"${TRAINYARD_BUILD_JOBS:-2}"
cd "$BUILD"
# halt_on_error: a finding fails the test; detect_leaks: gtest suites must not leak.
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j2 -L unit "$@"
