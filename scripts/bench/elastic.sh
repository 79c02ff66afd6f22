#!/usr/bin/env bash
# Elastic data parallel under failures on the cluster rig (tests/harness/rig.py): an
# elastic job of three replicas, failure-free and with a replica killed every --every
# seconds, beside a plain job's restart from its checkpoint, in one run; steps committed,
# recovery and heal times against the restart's, and the final dev accuracy of the job
# trained to its end with and without failures. scripts/bench/elastic.py says what the
# figures show and what they do not. Needs root.
#   scripts/bench/elastic.sh [--duration 120] [--every 30] [--timeout 2] [--accuracy-epochs 10] [--repeats 1]
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,8p' "$0"; exit 0; }
source scripts/bench/common.sh
"$PY" scripts/bench/elastic.py --worker "$(realpath "$WORKER")" --coordinator "$(realpath "$BIN/coordinator")" \
  --jobctl "$(realpath "$BIN/jobctl")" --mpirun "$(command -v mpirun)" "$@"
