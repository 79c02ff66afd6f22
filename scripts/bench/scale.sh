#!/usr/bin/env bash
# The coordinator at cluster scale: N simulated pool agents (scripts/bench/scale.py: each
# a CURVE client of its own speaking the real wire, whose jobs run no process) against a
# real coordinator and SQLite store, in seven scenarios: steady load, a burst of
# submissions, a burst with the coordinator killed (SIGKILL) and restarted midway, 10% of
# the agents lost at once, a preemption wave, five users with quotas under preemption
# (Kueue's scale test in kind), and a search of 1,000 trials. Prints one JSON object per
# scenario (agents, jobs, placed_per_s, submit_to_running_p50_ms and _p99_ms, pass_p99_ms,
# coordinator_cpu_pct, coordinator_rss_mb, restart_to_scheduling_s, jobs_lost,
# jobs_run_twice, and each scenario's own) and writes them to --out (default
# build/scale.json). With --curve 100,300,1000,3000 it measures a deep queue's placements
# a second and pass time at each agent count instead (--svg draws them). The agents and
# the coordinator share this machine's cores, so its CPU figures are an upper bound.
#   scripts/bench/scale.sh [--agents 1000] [--jobs 20000] [--scenario burst ...] [scale.py's other flags]
#   scripts/bench/scale.sh --curve 100,300,1000,3000 --svg docs/images/scale_curve.svg
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in -h|--help) sed -n '2,15p' "$0"; exit 0 ;; esac
PY="${TRAINYARD_VENV:-$HOME/.cache/trainyard/venv}/bin/python"
[[ -x build/bin/coordinator ]] || scripts/build.sh coordinator
out=build/scale.json
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
echo "$(date -u '+%Y-%m-%d') on $(hostname): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
"$PY" scripts/bench/scale.py --coordinator build/bin/coordinator --out "$out" "${args[@]}"
