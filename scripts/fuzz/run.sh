#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang with ASan and UBSan, in build-fuzz/)
# and runs each for a while from its seeds, with its dictionary (tests/fuzz/dict/). The
# invariant: every input ends in a parsed value or a clean error; a crash, a sanitizer
# report, a leak, a hang (-timeout) or a runaway allocation (-rss_limit_mb) fails the
# run. Each target runs with a 256 KiB stack: recursion that grows with its input (a
# parser descending once per level of nesting) overflows within the input sizes fuzzed,
# where an 8 MiB stack would hide it until an attacker's megabyte.
#   scripts/fuzz/run.sh [--seconds N] [--jobs J] [target...]
#     --seconds N   per target (default 600)
#     --jobs J      targets fuzzed at once (default 2)
#     target        fuzz_job_spec, fuzz_safetensors, fuzz_wire, ... (default: all)
# Prints, per target, the executions, exec/s, coverage and the verdict; exits 1 if any
# target failed. Reproducers land in build-fuzz/findings/<target>/ (replay one with
# build-fuzz/bin/<target> <file>); the growing corpus in build-fuzz/corpus/<target>/.
# TRAINYARD_WERROR=1 builds with -Werror (CI).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build-fuzz
SECONDS_PER_TARGET=600
JOBS=2
TARGETS=()
usage() { sed -n '2,13p' "$0"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_PER_TARGET=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "error: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[[ $SECONDS_PER_TARGET =~ ^[1-9][0-9]*$ ]] || { echo "error: --seconds needs a positive integer" >&2; exit 2; }
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "error: --jobs needs a positive integer" >&2; exit 2; }
if [[ ${#TARGETS[@]} -eq 0 ]]; then
  mapfile -t TARGETS < <(cd tests/fuzz && ls fuzz_*.cc | sed 's/\.cc$//')
fi

# Largest input per target: room for a long job file, a header with many tensors, a
# script of a few dozen frames.
max_len() {
  case "$1" in
    fuzz_job_spec) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

build() {
  local werror=OFF
  [[ ${TRAINYARD_WERROR:-0} == 1 ]] && werror=ON
  if [[ ! -f $BUILD/build.ninja ]]; then
    CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTRAINYARD_WITH_TORCH=OFF -DTRAINYARD_FUZZ=ON -DTRAINYARD_WERROR=$werror > "$BUILD.configure.log" 2>&1 ||
      { cat "$BUILD.configure.log"; exit 1; }
    mv "$BUILD.configure.log" "$BUILD/configure.log"
  fi
  ninja -C "$BUILD" -j"${TRAINYARD_BUILD_JOBS:-2}" "${TARGETS[@]}"
}

# fuzz TARGET: runs it; its log is $BUILD/findings/TARGET.log.
fuzz() {
  local target=$1 findings=$BUILD/findings/$1 corpus=$BUILD/corpus/$1
  rm -rf "$findings"
  mkdir -p "$findings" "$corpus" "tests/fuzz/corpus/$target" "tests/fuzz/regressions/$target"
  local dict=()
  [[ -f tests/fuzz/dict/$target.dict ]] && dict=(-dict="tests/fuzz/dict/$target.dict")
  # The first folder receives new inputs; the checked-in seeds and regressions are read only.
  (
    ulimit -s 256
    "$BUILD/bin/$target" "$corpus" "tests/fuzz/corpus/$target" "tests/fuzz/regressions/$target" "${dict[@]}" \
      -max_total_time="$SECONDS_PER_TARGET" -max_len="$(max_len "$target")" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$findings/" > "$BUILD/findings/$target.log" 2>&1
  )
}

# report TARGET RC: one summary line; returns non-zero for a failed run.
report() {
  local target=$1 rc=$2 log=$BUILD/findings/$1.log execs rate cov verdict=ok
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
  local artifacts
  artifacts=$(find "$BUILD/findings/$target" -type f | sort | tr '\n' ' ')
  if [[ $rc -ne 0 || -n $artifacts ]]; then
    verdict="FAILED (rc $rc): $(grep -m1 -E 'ERROR: |Test unit written|terminate called' "$log" || true)"
    [[ -n $artifacts ]] && verdict+=" reproducer(s): $artifacts"
  fi
  printf '%-22s %10s execs %8s exec/s  %-20s %s\n' "$target" "${execs:-?}" "${rate:-?}" "${cov:-cov: ?}" "$verdict"
  [[ $verdict == ok ]]
}

# The whole file is read before main runs, so editing it during a long run is safe.
main() {
  build
  mkdir -p "$BUILD/findings"
  echo "fuzzing ${TARGETS[*]} for ${SECONDS_PER_TARGET} s each, $JOBS at a time (logs: $BUILD/findings/<target>.log)"
  local -A rc_of=() pid_of=()
  local -a pending=("${TARGETS[@]}") batch
  local t rc failed=0
  while [[ ${#pending[@]} -gt 0 ]]; do
    batch=("${pending[@]:0:$JOBS}")
    pending=("${pending[@]:$JOBS}")
    for t in "${batch[@]}"; do
      fuzz "$t" &
      pid_of[$t]=$!
    done
    for t in "${batch[@]}"; do
      rc=0
      wait "${pid_of[$t]}" || rc=$?
      rc_of[$t]=$rc
    done
  done
  for t in "${TARGETS[@]}"; do
    report "$t" "${rc_of[$t]}" || failed=1
  done
  return $failed
}

main
