#!/usr/bin/env bash
# Serving benchmark: MLPerf LoadGen (mlcommons-loadgen) drives, through tritonclient's
# gRPC client, the worker's `kind: serve` and, in the same run, the reference: MLServer
# (the Open Inference Protocol in Python) with adaptive batching on, serving the same
# weights with transformers. Real topics texts of varying length, one per query; the same
# threads, maximum batch and queue delay on both sides. Prints, for each, the Offline
# scenario's throughput and the Server scenario's highest QPS whose p99 stays under the
# bound, their ratios, and our padding share with length-aware batching on and off.
# Installs mlserver and mlcommons-loadgen into the venv on first use.
#   scripts/bench/serve_load.sh [--threads 1] [--bound-ms 200] [--duration-s 10] [--max-batch 16]
#                               [--layers 4] [--hidden 256] [--steps 6]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/common.sh
[[ -x $BIN/serve_frontend ]] || { [[ -z ${TRAINYARD_BIN:-} ]] && scripts/build.sh serve_frontend; }
"$PY" -c "import mlserver, mlperf_loadgen" 2> /dev/null ||
  "$PY" -m pip install -q "mlserver==1.7.1" "mlcommons-loadgen==6.0.17"
"$PY" scripts/bench/serve_load.py --worker "$WORKER" --work "$WORK" "$@"
