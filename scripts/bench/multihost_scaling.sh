#!/usr/bin/env bash
# The same job on 1 host x 4 ranks, 2 hosts x 2 and 4 hosts x 1 of the cluster rig
# (tests/harness/rig.py: network namespaces, veth pairs, mpirun over ssh), in one run:
# ms/step, comm% and each layout against 1 x 4. A veth pair is not a datacenter network:
# scripts/bench/multihost_scaling.py says what the figures show and what they do not.
# Needs root.
#   scripts/bench/multihost_scaling.sh [--preset tiny] [--batch 16] [--seq 64] [--steps 40] [--repeats 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,7p' "$0"; exit 0; }
source scripts/bench/common.sh
STEPS=40 BATCH=16
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == --steps ]] && STEPS=${args[i + 1]}
  [[ ${args[i]} == --batch ]] && BATCH=${args[i + 1]}
done
make_long_tsv data/prepared/langid/train.tsv "$WORK/long.tsv" $((BATCH * 4 * (STEPS + 2)))
"$PY" scripts/bench/multihost_scaling.py --worker "$(realpath "$WORKER")" --train "$WORK/long.tsv" "$@"
