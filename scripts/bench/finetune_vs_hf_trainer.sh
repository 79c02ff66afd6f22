#!/usr/bin/env bash
# End-to-end fine-tune benchmark: the worker against Hugging Face Trainer, with and
# without group_by_length, on the same job: the same BERT preset, vocab.txt, data files,
# max length, epochs, batch, lr schedule (linear warm-up 10%, linear decay), AdamW betas,
# eps and weight decay, clipping at 1.0, dropout, seed and thread count, one process each,
# a dev evaluation and a checkpoint after every epoch. Tasks: langid (tiny, max length 64,
# lr 1e-3, as configs/jobs/langid_tiny.yaml) and topics (mini, max length 128, lr 5e-4).
# Prints, per task, the medians over the runs of the wall time from launch to exit, the
# time to reach the dev accuracy target and the final dev accuracy, and our ratios to
# each Trainer configuration (below 1: we are faster).
#   scripts/bench/finetune_vs_hf_trainer.sh [--tasks langid,topics] [--runs 3] [--epochs 3]
#     [--batch 32] [--threads 2] [--target-acc A] [--json FILE] [--systems hf_grouped,hf_default]
# --target-acc fixes the accuracy target; by default it is the lowest final dev accuracy of
# the task's runs, so every run reaches it. --systems picks the Trainer configurations run
# beside ours. A run takes about 5 minutes for langid and 25 for topics on two cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tasks|--runs|--epochs|--batch|--threads|--target-acc|--json|--systems) ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
"$PY" scripts/bench/finetune_vs_hf_trainer.py --worker "$WORKER" --python "$PY" --work "$WORK" ${ARGS[@]+"${ARGS[@]}"}
