# Sourced by the benchmark scripts, from the repository root: sets PY (the venv's
# python), builds the worker if it is missing, prepares the data, and makes WORK, a
# scratch folder removed on exit unless KEEP_WORK is set.
PY="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python"
[[ -x build/bin/worker ]] || scripts/build.sh worker
"$PY" scripts/prepare_data.py > /dev/null
WORK=$(mktemp -d)
[[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$WORK"' EXIT
