#!/usr/bin/env bash
# README command 1: installs what is missing, builds the worker, prepares the fortunes
# data and runs configs/jobs/langid_tiny.yaml on 2 MPI ranks (TRAINYARD_RANKS), printing
# the epoch table.
# Logs land in runs/langid_tiny/. Extra arguments go to the worker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh worker
"${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python" scripts/prepare_data.py
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # containers run as root
# Open MPI 4.1's mpirun can die of a late SIGPIPE at its shutdown, after the job has
# finished; ignored, that write fails harmlessly (Note [Job isolation], job_process.h).
trap '' PIPE
exec mpirun -n "${TRAINYARD_RANKS:-2}" --oversubscribe --bind-to none \
  build/bin/worker configs/jobs/langid_tiny.yaml --resume none "$@"
