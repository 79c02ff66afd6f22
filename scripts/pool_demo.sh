#!/usr/bin/env bash
# The coordinator path end to end on this machine: starts a coordinator (state and
# runs in a scratch folder), an mpirun worker pool of TRAINYARD_RANKS ranks (default 2),
# submits a job file (default configs/jobs/langid_tiny.yaml), follows its epoch rows
# with `jobctl logs -f`, prints `jobctl report`, and stops everything.
#   scripts/pool_demo.sh [JOB.yaml]        KEEP_WORK=1 keeps the scratch folder
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,6p' "$0"; exit 0 ;; esac
JOB=${1:-configs/jobs/langid_tiny.yaml}
RANKS=${TRAINYARD_RANKS:-2}
scripts/setup.sh
scripts/build.sh worker coordinator jobctl
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" scripts/prepare_data.py > /dev/null
WORK=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
ENDPOINT=tcp://127.0.0.1:$PORT
JOBCTL=(build/bin/jobctl --coordinator "$ENDPOINT" --keys "$WORK/keys")
# Every step runs whatever the ones before it returned (a pool stopped by SIGTERM
# exits non-zero, and `set -e` would end the trap there).
cleanup() {
  set +e
  local pid
  for pid in "${POOL:-}" "${COORDINATOR:-}"; do
    [[ -n $pid ]] || continue
    kill -TERM "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
  done
  if [[ -n "${KEEP_WORK:-}" ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
build/bin/coordinator --init --state "$WORK/trainyard.db" > /dev/null  # CURVE keys in $WORK/keys
build/bin/coordinator --listen "$ENDPOINT" --state "$WORK/trainyard.db" --runs "$WORK/runs" > "$WORK/coordinator.log" 2>&1 &
COORDINATOR=$!
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # containers run as root
mpirun -n "$RANKS" --oversubscribe --bind-to none build/bin/worker --coordinator "$ENDPOINT" --keys "$WORK/keys" > "$WORK/pool.log" 2>&1 &
POOL=$!
for _ in $(seq 60); do
  [[ $("${JOBCTL[@]}" --json workers 2> /dev/null | grep -c '"rank"') -ge "$RANKS" ]] && break
  sleep 1
done
"${JOBCTL[@]}" workers
ID=$("${JOBCTL[@]}" submit "$JOB")
echo "submitted $JOB as job $ID; following its epoch rows (the pool's console: $WORK/pool.log)"
"${JOBCTL[@]}" logs -f "$ID"
echo
"${JOBCTL[@]}" report "$ID"
