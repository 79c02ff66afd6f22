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
#     [--device cpu|cuda] [--precision fp32|bf16] [--cuda-graph] [--preset P] [--lr LR]
#     [--loader-threads N] [--init-preset] [--dropout P] [--seed N] [--run-timeout S] [--deadline S]
#     [--accumulation N] [--schedule linear|cosine|constant] [--eval-steps N] [--best-metric f1|accuracy|loss]
# --target-acc fixes the accuracy target; by default it is the lowest final dev accuracy of
# the task's runs, so every run reaches it. --systems picks the Trainer configurations run
# beside ours (hf_grouped, hf_default, hf_compiled: group_by_length with torch_compile).
# On a GPU: --device cuda --precision bf16 (Trainer's bf16=True), --cuda-graph for the
# worker's whole-step graphs, --init-preset to start both sides from one fresh Hugging
# Face folder of --preset. --run-timeout (per run) and --deadline (all runs, from start)
# kill a run that outlives them; it is shown as killed. A run takes about 5 minutes for
# langid and 25 for topics on two cores. --accumulation, --schedule, --eval-steps and
# --best-metric set gradient accumulation, the schedule, evaluations every N steps (with
# macro F1) and the best checkpoint on both sides (Trainer: eval_steps, save_steps,
# load_best_model_at_end); the table then also shows the seconds of one evaluation.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tasks|--runs|--epochs|--batch|--threads|--target-acc|--json|--systems|--device|--precision|--preset|--lr|\
    --loader-threads|--run-timeout|--deadline|--dropout|--seed|--accumulation|--schedule|--eval-steps|--best-metric)
      [[ $# -ge 2 ]] || { echo "$1 needs a value" >&2; exit 2; }
      ARGS+=("$1" "$2"); shift 2 ;;
    --cuda-graph|--init-preset) ARGS+=("$1"); shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
"$PY" scripts/bench/finetune_vs_hf_trainer.py --worker "$WORKER" --python "$PY" --work "$WORK" ${ARGS[@]+"${ARGS[@]}"}
