#!/usr/bin/env bash
# Data-parallel scaling on this machine, 1 intra-op thread per rank: the worker at 1 and
# 2 MPI ranks against PyTorch DDP (gloo, torch.multiprocessing) at 1 and 2 ranks, same
# model preset, data, sequence length and per-rank batch, in one run. Every batch is
# exactly batch x seq tokens. Prints samples/s, scaling efficiency (2-rank samples/s
# over twice the 1-rank figure), our ms/step over DDP's, and the share of a step spent
# in exposed communication with overlap on and off.
#   scripts/bench/ddp_scaling.sh [--preset tiny] [--batch 32] [--seq 64] [--steps 40]
set -euo pipefail
cd "$(dirname "$0")/../.."
PRESET=tiny BATCH=32 SEQ=64 STEPS=40 WARMUP=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;; --seq) SEQ=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;; -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if (( STEPS <= WARMUP )); then
  echo "error: --steps $STEPS: must be above the $WARMUP warm-up steps, which are not timed" >&2; exit 2
fi
source scripts/bench/common.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DATA=data/prepared/langid
"$PY" - "$DATA/train.tsv" "$WORK/long.tsv" $((BATCH * 2 * (STEPS + 2))) <<'PY'
import sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [l.rstrip("\n").split("\t", 1) for l in open(src, encoding="utf-8").readlines()[1:]]
by_label = {}
for label, text in rows:
    by_label.setdefault(label, []).append(text)
out, i = [], 0
labels = sorted(by_label)
while len(out) < count:                  # same-language texts joined until long enough
    label = labels[i % len(labels)]
    texts = by_label[label]
    text, j = "", i
    while len(text) < 1500:
        text += " " + texts[j % len(texts)]
        j += 1
    out.append(f"{label}\t{text.strip()}\n")
    i += 1
open(dst, "w", encoding="utf-8").write("label\ttext\n" + "".join(out))
PY
LABELS=$(cut -f1 "$WORK/long.tsv" | tail -n +2 | sort -u | wc -l)

ours() {  # ranks overlap -> "mean_ms median_ms mean_comm_ms median_comm_ms"
  cat > "$WORK/job.yaml" <<YAML
name: bench_ddp
data:
  train: $WORK/long.tsv
  max_seq_len: $SEQ
  bucket_batches: 1
  loader_threads: 1
  tokenizer: {vocab: $PWD/$DATA/vocab.txt}
model: {preset: $PRESET}
train: {epochs: 1, batch_size: $BATCH, max_steps: $STEPS, lr: 5.0e-4}
runtime: {device: cpu, threads: 1}
distributed: {overlap: $2, bucket_mb: 1}
log: {steps_every: 1, progress: false}
YAML
  mpirun -n "$1" --oversubscribe --bind-to none "$WORKER" "$WORK/job.yaml" --runs-dir "$WORK/runs" \
    --resume none > "$WORK/worker.log" 2>&1 || { cat "$WORK/worker.log"; exit 1; }
  "$PY" -c "
import json
rows = [json.loads(l) for l in open('$WORK/runs/bench_ddp/steps.jsonl')][$WARMUP:]
ms, comm = sorted(r['ms'] for r in rows), sorted(r['comm_ms'] for r in rows)
print(sum(ms) / len(ms), ms[len(ms) // 2], sum(comm) / len(comm), comm[len(comm) // 2])"
}
ddp() {
  "$PY" scripts/bench/ddp_reference.py --data "$WORK/long.tsv" --vocab "$DATA/vocab.txt" --preset "$PRESET" \
    --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" --ranks "$1" --labels "$LABELS" |
    "$PY" -c "import json,sys; d = json.load(sys.stdin); print(d['ms_per_step'], d['median_ms_per_step'])"
}
read -r OURS1 OURS1_MED _ _ <<< "$(ours 1 true)"
read -r OURS2 OURS2_MED COMM_ON COMM_ON_MED <<< "$(ours 2 true)"
read -r OURS2_OFF OURS2_OFF_MED COMM_OFF COMM_OFF_MED <<< "$(ours 2 false)"
read -r DDP1 DDP1_MED <<< "$(ddp 1)"
read -r DDP2 DDP2_MED <<< "$(ddp 2)"
"$PY" - "$OURS1" "$OURS2" "$DDP1" "$DDP2" "$OURS1_MED" "$OURS2_MED" "$DDP1_MED" "$DDP2_MED" \
  "$COMM_ON" "$OURS2" "$COMM_OFF" "$OURS2_OFF" "$COMM_ON_MED" "$OURS2_MED" "$COMM_OFF_MED" "$OURS2_OFF_MED" <<PY
import sys
v = list(map(float, sys.argv[1:]))
b = $BATCH
print(f"data-parallel scaling, preset $PRESET, batch {b}/rank x seq $SEQ, fp32, 1 thread/rank, steps $((WARMUP + 1))..$STEPS")
print("(mean step time, and in brackets the median step: on a shared machine a few stalled steps move the mean)")
print(f"{'':22}{'1 rank':>24}{'2 ranks':>24}{'efficiency':>16}")
for name, one, two, one_m, two_m in (("trainyard (MPI)", v[0], v[1], v[4], v[5]), ("PyTorch DDP (gloo)", v[2], v[3], v[6], v[7])):
    print(f"{name:22}{b * 1000 / one:10.1f} [{b * 1000 / one_m:6.1f}] smp/s{2 * b * 1000 / two:10.1f} [{2 * b * 1000 / two_m:6.1f}] smp/s"
          f"{one / two:9.2f} [{one_m / two_m:4.2f}]")
print(f"ms/step ours / DDP:   1 rank {v[0] / v[2]:.3f} [{v[4] / v[6]:.3f}]   2 ranks {v[1] / v[3]:.3f} [{v[5] / v[7]:.3f}]")
con, oon, coff, ooff, conm, oonm, coffm, ooffm = v[8:]
print(f"exposed communication at 2 ranks: overlap on {100 * con / oon:.1f}% of the step ({con:.1f} ms, median {conm:.1f}), "
      f"overlap off {100 * coff / ooff:.1f}% ({coff:.1f} ms, median {coffm:.1f})")
PY
