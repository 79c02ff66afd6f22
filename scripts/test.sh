#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything, prepares the data and
# runs every test (gtest suites, the Hugging Face / PyTorch reference tests, the
# end-to-end worker, pool and MPI tests, the many-host tests on a cluster of network
# namespaces; the gpu-labelled tests report themselves as skipped without a GPU).
#   scripts/test.sh                 everything
#   scripts/test.sh --quick         the unit and reference tests only (about 2 minutes once built)
#   scripts/test.sh [--quick] ARGS  extra arguments go to ctest (e.g. -R ddp_ or -L mpi)
# TRAINYARD_WERROR=1 builds with -Werror (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
LABELS=()
if [[ ${1:-} == --quick ]]; then
  LABELS=(-L 'unit|reference')
  shift
elif [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,9p' "$0"
  exit 0
fi
scripts/setup.sh
scripts/build.sh
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" scripts/prepare_data.py
# The cluster tests make network namespaces and veth links named tyc* (tests/cluster/);
# whatever the outcome, none may be left behind, nor a process in one.
rig_leftovers() {
  local space
  for space in $(ip netns list 2>/dev/null | awk '/^tyc/ {print $1}'); do
    echo "namespace $space (processes: $(ip netns pids "$space" | tr '\n' ' '))"
  done
  ip -o link 2>/dev/null | awk -F': ' '$2 ~ /^tyc/ {print "link " $2}'
}
before=$(rig_leftovers)
cd build
status=0
ctest --output-on-failure -j2 --timeout 900 "${LABELS[@]}" "$@" || status=$?
after=$(rig_leftovers)
if [[ "$after" != "$before" ]]; then
  echo "error: the tests left cluster namespaces, links or processes behind:" >&2
  echo "$after" >&2
  exit 1
fi
exit "$status"
