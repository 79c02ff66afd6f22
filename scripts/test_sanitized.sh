#!/usr/bin/env bash
# Builds the torch-free targets with AddressSanitizer and UndefinedBehaviorSanitizer
# (or TRAINYARD_SANITIZE=thread) into build-sanitize-*/ and runs their unit suites: the
# job spec, data, coordinator and common suites, and everything that parses bytes
# from files or the wire. Assumes scripts/setup.sh has run.
# --torch builds and runs the torch-linked unit suites instead (kernels and the CPU block
# cache, models, the input pipeline and its prefetch, the optimizer and checkpoints, the
# link order, the comm thread and reducer under 1, 2 and 4 MPI ranks, memory caps), our code instrumented
# and libtorch not (about 12 minutes on two cores from an empty cache; CI runs only the
# torch-free part). docs/testing.md says what the torch run cannot see.
#   scripts/test_sanitized.sh [--torch] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
SANITIZE="${TRAINYARD_SANITIZE:-address,undefined}"
TORCH=OFF
if [[ ${1:-} == --torch ]]; then
  TORCH=ON
  shift
fi
BUILD="build-sanitize-${SANITIZE//,/-}"
[[ $TORCH == ON ]] && BUILD="build-sanitize-torch-${SANITIZE//,/-}"
TORCH_SUITES=(kernels_test models_test batch_pipeline_test train_test link_order_test comm_test jobs_test)
WERROR=OFF
[[ ${TRAINYARD_WERROR:-0} == 1 ]] && WERROR=ON
if [[ ! -f $BUILD/build.ninja ]]; then
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTRAINYARD_WITH_TORCH=$TORCH \
    -DTRAINYARD_SANITIZE="$SANITIZE" -DTRAINYARD_WERROR=$WERROR > "$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; exit 1; }
fi
if [[ $TORCH == ON ]]; then
  ninja -C "$BUILD" -j"${TRAINYARD_BUILD_JOBS:-2}" "${TORCH_SUITES[@]}"
  cd "$BUILD"
  # allocator_may_return_null: link_order_test asks for an impossible allocation and
  # expects libtorch's exception, not ASan's report. The memory-cap tests are left out:
  # they cap the address space (RLIMIT_AS), which ASan's shadow memory cannot live under.
  # Open MPI keeps its start-up allocations until exit (tests/sanitizer/lsan_open_mpi.supp).
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:fast_unwind_on_malloc=0
  export LSAN_OPTIONS=suppressions=$PWD/../tests/sanitizer/lsan_open_mpi.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  failed=()
  for suite in kernels_test models_test batch_pipeline_test train_test link_order_test jobs_test; do
    echo "== $suite"
    ./bin/$suite --gtest_brief=1 --gtest_filter=-MemoryCapTest.* || failed+=("$suite")
  done
  for ranks in 2 4; do
    echo "== comm_test, $ranks ranks"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun --oversubscribe --bind-to none -n $ranks ./bin/comm_test --gtest_brief=1 || failed+=("comm_test ($ranks ranks)")
  done
  [[ ${#failed[@]} -eq 0 ]] || { echo "sanitized torch suites failed: ${failed[*]}" >&2; exit 1; }
  echo "sanitized torch suites: clean"
  exit 0
fi
ninja -C "$BUILD" -j"${TRAINYARD_BUILD_JOBS:-2}"
cd "$BUILD"
# halt_on_error: a finding fails the test; detect_leaks: gtest suites must not leak.
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j2 -L unit "$@"
