# Sourced by the benchmark scripts, from the repository root: sets PY (TRAINYARD_PYTHON,
# else the venv's python) and WORKER (the worker binary under TRAINYARD_BIN, default
# build/bin, built if it is missing there), prepares the data, and makes WORK, a
# scratch folder removed on exit unless KEEP_WORK is set.
PY="${TRAINYARD_PYTHON:-${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python}"
BIN="${TRAINYARD_BIN:-build/bin}"
WORKER="$BIN/worker"
[[ -x $WORKER ]] || { [[ -z ${TRAINYARD_BIN:-} ]] && scripts/build.sh worker; } ||
  { echo "error: no worker binary at $WORKER" >&2; exit 2; }
"$PY" scripts/prepare_data.py > /dev/null
WORK=$(mktemp -d)
[[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$WORK"' EXIT
