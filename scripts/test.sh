#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything, prepares the data and
# runs every test (gtest suites, the Hugging Face / PyTorch reference tests, the
# end-to-end worker, pool and MPI tests, the many-host tests on a cluster of network
# namespaces; the gpu-labelled tests report themselves as skipped without a GPU).
#   scripts/test.sh                 everything
#   scripts/test.sh --quick         the unit and reference tests only (about 3 minutes once built)
#   scripts/test.sh --labels REGEX  the tests whose labels match (e.g. 'torch|reference')
#   scripts/test.sh [--quick] ARGS  extra arguments go to ctest (e.g. -R ddp_ or -L mpi)
# At the end it prints the 10 slowest tests, the time per label and any test over its
# budget (docs/testing.md, "Time budgets").
# TRAINYARD_WERROR=1 builds with -Werror (CI does). TRAINYARD_TEST_JOBS is how many tests
# compute at once (2; on two cores more makes the tests that wait on their own deadlines
# fail); up to two tests that mostly sleep run beside them (tests/CMakeLists.txt, "Cores").
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
  sed -n '2,13p' "$0"
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
# Two tests share the two cores, each with OpenMP threads of its own. OpenMP's
# threads spin while idle by default, so two such tests slow each other several times
# over (a fine-tune that takes 15 s alone took 100 s beside another); asleep when idle,
# they share the cores. Tests that time themselves run alone with the default (ty_alone).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd build
status=0
log=$(mktemp)
set +e
cores=${TRAINYARD_TEST_JOBS:-2}
printf '{"version": {"major": 1, "minor": 0}, "local": [{"cores": [{"id": "0", "slots": %d}]}]}\n' "$cores" \
  > test-cores.json
ctest --output-on-failure -j"$((cores + 2))" --resource-spec-file test-cores.json --timeout 900 "${LABELS[@]}" "$@" \
  2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Where the time went: the slowest tests, the time per label and the tests over their
# budgets (docs/testing.md, "Time budgets").
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" ../scripts/test_times.py --log "$log" --build . || true
rm -f "$log"
# A test must not replace a device the machine shares: a /dev/null turned into a regular
# file feeds its content to every process that reads it.
if [[ ! -c /dev/null ]]; then
  echo "error: /dev/null is no longer a character device after the tests (restore it: rm /dev/null &&" \
    "mknod -m 666 /dev/null c 1 3)" >&2
  exit 1
fi
after=$(rig_leftovers)
if [[ "$after" != "$before" ]]; then
  echo "error: the tests left cluster namespaces, links or processes behind:" >&2
  echo "$after" >&2
  exit 1
fi
exit "$status"
