#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything, prepares the data and
# runs every test (gtest suites, the Hugging Face / PyTorch reference tests, the
# end-to-end worker, pool and MPI tests, the many-host tests on a cluster of network
# namespaces; the gpu-labelled tests report themselves as skipped without a GPU).
#   scripts/test.sh                 everything
#   scripts/test.sh --quick         the unit and reference tests only (about 3 minutes once built)
#   scripts/test.sh --labels REGEX  the tests whose labels match (e.g. 'torch|reference')
#   scripts/test.sh [--quick] ARGS  extra arguments go to ctest (e.g. -R ddp_ or -L mpi)
# At the end it prints the 10 slowest tests and ctest's time per label.
# TRAINYARD_WERROR=1 builds with -Werror (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
LABELS=()
if [[ ${1:-} == --quick ]]; then
  LABELS=(-L 'unit|reference')
  shift
elif [[ ${1:-} == --labels ]]; then
  [[ $# -ge 2 && -n $2 ]] || { echo "scripts/test.sh: --labels needs a regular expression" >&2; exit 2; }
  LABELS=(-L "$2")
  shift 2
elif [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,10p' "$0"
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
log=$(mktemp)
set +e
ctest --output-on-failure -j2 --timeout 900 "${LABELS[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Where the time went: the slowest tests (ctest's own label summary is printed above).
echo "the 10 slowest tests:"
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+.* ([0-9.]+) sec$/\2 \1/p' "$log" | sort -rn | head -n 10 |
  awk '{ printf "  %8.1f s  %s\n", $1, $2 }'
rm -f "$log"
after=$(rig_leftovers)
if [[ "$after" != "$before" ]]; then
  echo "error: the tests left cluster namespaces, links or processes behind:" >&2
  echo "$after" >&2
  exit 1
fi
exit "$status"
