#!/usr/bin/env bash
# One lent-GPU call that gathers the facts docs/performance.md starts from, in priority
# order and within a deadline, so a short lease returns something useful even when a
# step runs long. Run it from the repository root on the GPU machine, with .gpu-bundle
# carried (scripts/gpu/bundle.sh makes it):
#   scripts/gpu/one_call.sh [--deadline SECONDS] [--skip-build] [--no-tests] [--spread N]
# Steps, each started only if the time left allows its estimate:
#   1. build_and_test.sh --only gpu: unpack, configure, build, `ctest -L gpu -V`
#      (3 at a time, each at most 200 s); --skip-build reuses build-gpu/, --no-tests
#      skips the tests;
#   2. the bf16 train step of bert-base, seq 128, batch 64, profiled (Kineto, 5 steps):
#      ours eager next to PyTorch eager, plus the kernel table;
#   3. the run-to-run spread: N more pairs (default 3) of that step, eager and with
#      whole-step CUDA graphs (train.cuda_graph: true) in turn, each next to PyTorch
#      eager in the same run, while nvidia-smi samples the SM clock, power and throttle
#      reasons every 200 ms.
# $OUT receives (the lease returns at most 8 files): summary.txt (one line per step),
# facts.txt, ctest-gpu.log, profile_bf16.txt, spread.txt (every run's figures and the
# medians), clocks.csv, and logs.tar.gz (build logs, each run's steps.jsonl and logs).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
DEADLINE=540 SKIP_BUILD=0 SPREAD=3 ONLY=gpu
while [[ $# -gt 0 ]]; do
  case "$1" in
    --deadline|--spread)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "one_call.sh: $1 needs a whole number (--deadline: seconds; --spread: pairs)" >&2; exit 2; }
      if [[ $1 == --deadline ]]; then DEADLINE=$2; else SPREAD=$2; fi
      shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;; --no-tests) ONLY=none; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "one_call.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
SUMMARY=$OUT/summary.txt
START=$SECONDS
note() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*" | tee -a "$SUMMARY"; }
fits() { (( SECONDS - START + $1 <= DEADLINE )); }  # fits ESTIMATED_SECONDS
finish() {
  [[ -n "${SMI_PID:-}" ]] && kill "$SMI_PID" 2> /dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2> /dev/null
  note "done"
}
trap finish EXIT

# 1. Build and the gpu tests.
BUILD_ARGS=(--only "$ONLY")
[[ $SKIP_BUILD -eq 1 ]] && BUILD_ARGS+=(--skip-build)
note "build_and_test.sh ${BUILD_ARGS[*]}"
OUT=$LOGS/build TY_GPU_TEST_TIMEOUT=200 TY_GPU_TEST_JOBS=3 scripts/gpu/build_and_test.sh "${BUILD_ARGS[@]}" > "$LOGS/build_and_test.out" 2>&1
note "build_and_test.sh exit $?"
cat "$LOGS/build/summary.txt" >> "$SUMMARY" 2> /dev/null
cp "$LOGS/build/facts.txt" "$OUT/" 2> /dev/null
cp "$LOGS/build/ctest-gpu.log" "$OUT/" 2> /dev/null
grep -E '^ *[0-9]+/[0-9]+ Test +#' "$OUT/ctest-gpu.log" 2> /dev/null | tee -a "$SUMMARY"
[[ -x build-gpu/bin/worker ]] || { note "no worker was built: stopping"; exit 1; }
# shellcheck disable=SC1091
source build-gpu/env.sh
export TRAINYARD_BIN=$PWD/build-gpu/bin TRAINYARD_PYTHON=${TRAINYARD_PYTHON:-$(command -v python3)}

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > "$OUT/clocks.csv" 2>&1 &
SMI_PID=$!

STEP=(--device cuda --preset base --seq 128 --batch 64 --steps 60 --threads 4 --precision bf16)
pair() {  # NAME EXTRA-ARGS...: one worker run and its PyTorch eager reference
  local name=$1; shift
  local t0=$SECONDS
  echo "--- $name (clock $((SECONDS - START)) s): train_step_vs_pytorch.sh ${STEP[*]} $*" >> "$OUT/spread.txt"
  if scripts/bench/train_step_vs_pytorch.sh "${STEP[@]}" --json "$LOGS/$name.json" "$@" > "$LOGS/$name.out" 2>&1; then
    cat "$LOGS/$name.out" >> "$OUT/spread.txt"
  else
    echo "FAILED:"; tail -n 30 "$LOGS/$name.out"
  fi >> "$OUT/spread.txt"
  note "$name: $((SECONDS - t0)) s"
}

# 2. The profiled bf16 step.
if fits 90; then
  pair profiled --profile "$LOGS/profile_bf16"
  cp "$LOGS/profile_bf16/profile.txt" "$OUT/profile_bf16.txt" 2> /dev/null
fi

# 3. The spread, eager and graphed in turn.
for ((i = 1; i <= SPREAD; ++i)); do
  fits 50 && pair "eager_$i"
  fits 50 && pair "graphed_$i" --cuda-graph
done

python3 - "$LOGS" >> "$OUT/spread.txt" <<'PY'
import glob, json, os, statistics, sys
rows = {"eager": [], "graphed": []}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name = os.path.basename(path)[:-5]
    r = json.load(open(path))
    kind = "graphed" if r["cuda_graph"] else "eager"
    rows[kind].append((name, r["ours_ms"], r["pytorch_ms"]))
print("\n=== medians (bf16, bert-base, seq 128, batch 64) ===")
for kind, runs in rows.items():
    if not runs:
        continue
    ours = [o for _, o, _ in runs]
    ref = [p for _, _, p in runs]
    ratios = [o / p for _, o, p in runs]
    spread = (max(ours) - min(ours)) / statistics.median(ours)
    print(f"{kind:8} runs {len(runs)}: ours {[round(o, 2) for o in ours]} median {statistics.median(ours):.2f} ms "
          f"(spread {spread:.1%}); PyTorch eager {[round(p, 2) for p in ref]} median {statistics.median(ref):.2f}; "
          f"ratio median {statistics.median(ratios):.3f}")
PY
tail -n 4 "$OUT/spread.txt" >> "$SUMMARY"
