#!/usr/bin/env bash
# Generation benchmark, one run: the worker's `kind: generate` next to transformers'
# generate() on the same GPT-2 weights (GPT-2-small shaped by default, over the lm/ BPE
# vocabulary), the same 32-token fortunes prompts, greedy, every row generating the same
# number of new tokens, the same threads; at batch 1 (the Keras benchmark's case) and 8.
# Prints time to first token and decoding tokens/s, medians of --repeats runs, and the
# ratio ours / HF. --json FILE also writes the figures there (scripts/bench/cpu_page.sh).
#   scripts/bench/generate_vs_hf.sh [--shape small|mini|tiny] [--threads 2] [--new-tokens 64] [--repeats 3]
#     [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
SHAPE=small THREADS=2 NEW=64 REPEATS=3 BATCHES="1 8" JSON=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shape) SHAPE=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;; --new-tokens) NEW=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;; --json) JSON=$2; shift 2 ;; -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source scripts/bench/common.sh
LM=$PWD/data/prepared/lm
BPE="--vocab $LM/bpe/vocab.json --merges $LM/bpe/merges.txt"
"$PY" scripts/bench/generate_reference.py prepare $BPE --shape "$SHAPE" --out "$WORK/model" \
  --dev "$LM/dev.txt" --prompts "$WORK/prompts.txt" 2>/dev/null
for B in $BATCHES; do
  for R in $(seq "$REPEATS"); do
    cat > "$WORK/gen_$B.yaml" <<YAML
name: bench_generate_${B}_$R
kind: generate
data:
  tokenizer: {kind: bpe, vocab: $LM/bpe/vocab.json, merges: $LM/bpe/merges.txt}
model: {init: $WORK/model}
generate: {prompts: $WORK/prompts.txt, batch_size: $B, max_new_tokens: $NEW, ignore_stop: true}
runtime: {device: cpu, threads: $THREADS}
YAML
    # Only the first batch of B prompts: the same work as the reference's.
    head -n "$B" "$WORK/prompts.txt" > "$WORK/prompts_$B.txt"
    sed -i "s|prompts: $WORK/prompts.txt|prompts: $WORK/prompts_$B.txt|" "$WORK/gen_$B.yaml"
    "$WORKER" "$WORK/gen_$B.yaml" --runs-dir "$WORK/runs" > "$WORK/gen_${B}_$R.log" 2>&1 ||
      { cat "$WORK/gen_${B}_$R.log"; exit 1; }
  done
done
"$PY" scripts/bench/generate_reference.py time $BPE --model "$WORK/model" --prompts "$WORK/prompts.txt" \
  --threads "$THREADS" --batches $BATCHES --new-tokens "$NEW" --repeats "$REPEATS" > "$WORK/ref.json" 2>/dev/null
"$PY" - "$WORK/runs" "$WORK/ref.json" "$JSON" $BATCHES <<PY
import glob, json, statistics, sys
runs, ref, out, batches = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4:]
result = {"shape": "$SHAPE", "threads": $THREADS, "new_tokens": $NEW, "repeats": $REPEATS, "rows": []}
print(f"greedy generation, GPT-2 $SHAPE shape, 32-token prompts, $NEW new tokens, $THREADS threads, fp32 CPU")
print(f"(medians of $REPEATS runs; decoding tokens/s counts every row's tokens after the first)")
print(f"{'batch':>5} {'ttft ours ms':>13} {'ttft HF ms':>11} {'tok/s ours':>11} {'tok/s HF':>9} {'tok/s ours/HF':>14}")
for b in batches:
    ours = [json.load(open(p)) for p in glob.glob(f"{runs}/bench_generate_{b}_*/summary.json")]
    ttft = statistics.median(o["first_token_ms_median"] for o in ours)
    tps = statistics.median(o["decode_tokens_per_s"] for o in ours)
    r = ref[b]
    print(f"{b:>5} {ttft:13.1f} {r['first_token_ms']:11.1f} {tps:11.1f} {r['tokens_per_s']:9.1f} {tps / r['tokens_per_s']:14.2f}")
    result["rows"].append({"batch": int(b), "first_token_ms": ttft, "hf_first_token_ms": r["first_token_ms"],
                           "tokens_per_s": tps, "hf_tokens_per_s": r["tokens_per_s"]})
if out:
    json.dump(result, open(out, "w"), indent=1)
PY
