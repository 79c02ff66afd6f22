#!/usr/bin/env python3
"""Writes docs/performance-cpu.md from the JSON that scripts/bench/cpu_page.sh keeps in
docs/measurements/cpu/: every figure on the page comes from there, with the machine, date,
command and commit that measured it. --check compares the page with what it would write
(exit 1 when they differ), so the page cannot drift from its measurements."""
import argparse
import glob
import json
import os
import statistics
import sys


def load(folder, name):
    path = os.path.join(folder, name)
    return json.load(open(path)) if os.path.exists(path) else None


def ratio(a, b):
    return f"{a / b:.2f}x" if a == a and b == b and b > 0 else "-"


def intro(env):
    memory = f", {env['memory_gib']} GiB" if env.get("memory_gib") else ""
    return [
        "# Performance on a CPU", "",
        "<!-- Written by scripts/bench/cpu_page.py from docs/measurements/cpu/*.json: change the script "
        "or rerun the measurements, not this page. -->", "",
        f"Measured on {env['date']} on this machine: {env['cpu']}, {env['cores']} cores{memory}, kernel {env['kernel']}; "
        f"torch {env['torch']}, Trainyard at commit `{env['commit']}`, by `{env['command'].strip()}`. "
        "That script runs each benchmark below, which times our path and its reference in the same run, "
        "keeps their JSON in `docs/measurements/cpu/` and writes this page. Figures are medians of "
        f"{env['runs']} runs unless a table says otherwise. Small shared machines are noisy: compare the "
        "ratios, and rerun the script on yours.", ""]


def finetune_section(data):
    if not data:
        return []
    out = ["## Fine-tuning against Hugging Face `Trainer`", "",
           "`scripts/bench/finetune_vs_hf_trainer.sh`: the same job on both sides (BERT preset, vocab.txt, "
           "data files, max length, 3 epochs, batch 32, linear warm-up and decay, AdamW settings, clipping, "
           "dropout, seed and threads), launch to exit, one process each, a dev evaluation and a checkpoint "
           "every epoch. Below 1x we are faster.", "",
           "| task | ours | `Trainer` + `group_by_length` | ours / grouped | `Trainer` defaults | ours / defaults "
           "| final dev accuracy (ours / grouped / defaults) |",
           "|---|---|---|---|---|---|---|"]
    names = {"langid": "langid, tiny, max length 64", "topics": "topics, mini, max length 128"}
    for task, r in data.items():
        s = r["systems"]
        ours, grouped, default = s.get("trainyard"), s.get("hf_grouped"), s.get("hf_default")
        cell = lambda row: f"{row['wall_s']:.1f} s" if row else "-"
        acc = lambda row: f"{row['final_acc']:.3f}" if row else "-"
        out.append(f"| {names.get(task, task)} | {cell(ours)} | {cell(grouped)} | "
                   f"{ratio(ours['wall_s'], grouped['wall_s']) if grouped else '-'} | {cell(default)} | "
                   f"{ratio(ours['wall_s'], default['wall_s']) if default else '-'} | "
                   f"{acc(ours)} / {acc(grouped)} / {acc(default)} |")
    if "topics" not in data:
        out += ["", "This run measured langid only; `scripts/bench/cpu_page.sh --tasks langid,topics` adds topics "
                "(mini, max length 128), about 25 minutes a run on two cores."]
    optimizer = str(next(iter(data.values())).get("hf_optimizer")).replace("OptimizerNames.", "").lower()
    out += ["", f"`Trainer`'s optimizer: {optimizer}. What we do differently: length-bucketed batches "
            "(`data.bucket_batches`, as `group_by_length`), ATen's fused AdamW, one GEMM for the query, key and "
            "value projections, token ids cached after the first epoch, dropout masks hashed in parallel "
            "instead of drawn serially, and unpadding where a batch is over 10% padding (`model.unpad`). "
            "Their separate shares have not been measured; `log.profile_steps` shows where a step's time goes, "
            "by operator.", "",
            "Where the products of frozen weights already run near this CPU's ceiling "
            "(`scripts/bench/cpu_gemm.sh`), the gains come from work around them and work not done:",
            "- a classifier's head reads the last layer at position 0 only, so that layer's query, attention "
            "output, feed-forward and their gradients run on B rows instead of B x S (`Rows::kFirst` in "
            "`worker/models/layers.h`); keys and values still cover every token;",
            "- LoRA's update is one node (`worker/models/low_rank_update.h`): h is kept transposed and the update "
            "added in place by one `addmm`, with the query and value adapters riding on the fused QKV product;",
            "- GELU keeps its derivative from the forward pass (`Gelu` in `worker/models/layers.h`), so the "
            "backward pass is one multiplication.", ""]
    return out


def first_day_section(data, env):
    """The fine-tune with a first day's settings on both sides: its own machine and date."""
    if not data or not env:
        return []
    r = data["langid"]
    s, settings = r["systems"], r["settings"]
    ours, hf = s["trainyard"], s["hf_grouped"]
    row = lambda x: (f"{x['wall_s']:.1f} s | {x['final_acc']:.3f} | {x['best']:.3f} | {x['evaluations']} | "
                     f"{x['eval_s']:.3f} s")
    return ["## Fine-tuning with accumulation, evaluations every 50 steps and the best checkpoint", "",
            f"Measured on {env['date']} on {env['cpu']}, {env['cores']} cores, torch {env['torch']}, at commit "
            f"`{env['commit']}`, by `{env['command'].strip()}`, medians of {env['runs']} runs. "
            "`scripts/bench/finetune_vs_hf_trainer.sh` as above (langid, tiny, max length 64, "
            f"{settings['epochs']} epochs) with `--accumulation {settings['accumulation']} --schedule "
            f"{settings['schedule']} --eval-steps {settings['eval_steps']} --best-metric {settings['best_metric']}`: "
            f"batch {settings['batch']} x {settings['accumulation']} micro-batches a step, the cosine schedule, the "
            "dev set evaluated every 50 steps with accuracy and macro F1, precision and recall, and the best "
            "evaluation's checkpoint kept by F1 and loaded at the end. `Trainer` gets "
            "`gradient_accumulation_steps`, `lr_scheduler_type=\"cosine\"`, `eval_steps` and `save_steps` of 50, "
            "`load_best_model_at_end` with `metric_for_best_model=\"f1\"` and scikit-learn's metrics, and "
            "`group_by_length`. We also evaluate at each epoch's end (the epoch table's columns).", "",
            "| | wall | final dev accuracy | best dev F1 | evaluations | seconds per evaluation |",
            "|---|---|---|---|---|---|",
            f"| ours | {row(ours)} |", f"| `Trainer` + `group_by_length` | {row(hf)} |",
            f"| ours / `Trainer` | {ratio(ours['wall_s'], hf['wall_s'])} | | | | "
            f"{ratio(ours['eval_s'], hf['eval_s'])} |", ""]


def inference_section(runs):
    if not runs:
        return []
    modes = ("eager", "torchscript", "int8", "aoti")
    first = runs[0]
    out = ["## Inference latency", "",
           f"`scripts/bench/inference_vs_pytorch.sh`: BERT {first['preset']}, fp32, {first['threads']} threads, "
           "mean ms per batch. Our modes (a `kind: benchmark` grid) next to HF `BertForSequenceClassification` "
           "in PyTorch eager and the same model exported to ONNX Runtime, with the same weights and inputs.", "",
           "| batch x seq | eager | TorchScript | `int8` | `aoti` | PyTorch eager | ONNX Runtime "
           "| our best / PyTorch | our best / ONNX Runtime |",
           "|---|---|---|---|---|---|---|---|---|"]
    for i, cell in enumerate(first["latency"]):
        med = {k: statistics.median(r["latency"][i][k] for r in runs) for k in modes + ("pytorch", "onnxruntime")}
        best = min((med[m], m) for m in modes if med[m] == med[m])
        out.append(f"| {cell['batch']} x {cell['seq']} | " + " | ".join(f"{med[m]:.2f}" for m in modes) +
                   f" | {med['pytorch']:.2f} | {med['onnxruntime']:.2f} | {ratio(best[0], med['pytorch'])} "
                   f"(`{best[1]}`) | {ratio(best[0], med['onnxruntime'])} |")
    out += ["", "Which mode is fastest depends on the cell, so the table names it: `int8` quantizes the Linear "
            "layers' weights (less memory traffic, but each batch's activations are quantized too) and `aoti` "
            "runs an AOTInductor package (`scripts/export_aoti.py`). A classifier's last layer computes "
            "position 0 alone (`Rows::kFirst` in `worker/models/layers.h`), except in `int8` models, whose "
            "activations' quantization range spans every row.", ""]
    out += ["## Sorted batching", "",
            "The second half of the same script: `kind: inference` over the topics dev split (tiny preset), "
            "file order against sorted by length (`inference.sort_by_length: both`), texts per second.", "",
            "| batch | file order | padding | sorted by length | padding | sorted / file order |",
            "|---|---|---|---|---|---|"]
    for i, cell in enumerate(first["sorted"]):
        med = {k: statistics.median(r["sorted"][i][k] for r in runs) for k in cell if k != "batch"}
        out.append(f"| {cell['batch']} | {med['file_order_texts_per_s']:.1f} | {med['file_order_padding_pct']:.1f}% "
                   f"| {med['sorted_texts_per_s']:.1f} | {med['sorted_padding_pct']:.1f}% "
                   f"| {med['sorted_texts_per_s'] / med['file_order_texts_per_s']:.2f}x |")
    return out + [""]


def generate_section(data):
    if not data:
        return []
    out = ["## Generation", "",
           f"`scripts/bench/generate_vs_hf.sh`: GPT-2 {data['shape']} shaped over the lm/ BPE vocabulary, "
           f"32-token prompts, {data['new_tokens']} new tokens, greedy, {data['threads']} threads, fp32; our "
           f"`kind: generate` against transformers' `generate()`, medians of {data['repeats']} runs each. "
           "Decoding tokens/s counts every row's tokens after the first.", "",
           "| batch | time to first token, ours | HF | decoding tokens/s, ours | HF | tokens/s, ours / HF (above 1: "
           "we are faster) |",
           "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        out.append(f"| {r['batch']} | {r['first_token_ms']:.1f} ms | {r['hf_first_token_ms']:.1f} ms "
                   f"| {r['tokens_per_s']:.1f} | {r['hf_tokens_per_s']:.1f} "
                   f"| {r['tokens_per_s'] / r['hf_tokens_per_s']:.2f}x |")
    return out + ["", "A decode step is one pass over every weight with one row (or a few) of activations: a "
                  "matrix-vector product bound by memory bandwidth, which `worker/kernels/gemv.h` streams on "
                  "every thread (next table). The prefill goes through the CPU library's products, as HF's "
                  "does. Both sides run a first batch untimed.", ""]


def gemv_section(data):
    if not data:
        return []
    out = ["## The decode-step product", "",
           f"`scripts/bench/gemv_vs_mkl.sh`: x of 1 to 32 rows times GPT-2 small's block weights "
           f"({data['weights_mb']} MB fp32, so every pass reads them from memory), {data['threads']} threads, "
           f"ms per pass, medians of {data['runs']} processes; `worker/kernels/gemv.h` against `at::addmm` "
           "(MKL).", "",
           "| rows | ours | `addmm` | ours / `addmm` | ours, GB/s |", "|---|---|---|---|---|"]
    for r in data["rows"]:
        out.append(f"| {r['rows']} | {r['ours_ms']:.1f} ms | {r['addmm_ms']:.1f} ms | "
                   f"{ratio(r['ours_ms'], r['addmm_ms'])} | {data['weights_mb'] / r['ours_ms']:.1f} |")
    return out + [""]


def precision_section(data, env):
    if not data:
        return []
    fp32, bf16 = data["mean_ms"]["fp32"], data["mean_ms"]["bf16"]
    units = ("lscpu lists AMX" if env.get("amx") else
             "lscpu lists AVX512-BF16, no AMX" if env.get("avx512_bf16") else "lscpu lists neither AMX nor AVX512-BF16")
    return ["## Which precision on a CPU", "",
            f"A `kind: benchmark` grid, BERT {data['preset']}, batch {data['batch']} x {data['seq']}, "
            f"{data['threads']} threads, medians of {data['runs']} runs, on this CPU ({units}):", "",
            "| fp32 | bf16 autocast | bf16 / fp32 |", "|---|---|---|",
            f"| {fp32:.1f} ms | {bf16:.1f} ms | {ratio(bf16, fp32)} |", "",
            "AVX512-BF16's dot products have the same peak as fp32 FMAs; only AMX's tile units make bf16 "
            "faster. A job asking for bf16 on a CPU without AMX starts with a warning saying so; use `bf16` on "
            "CUDA, or on CPUs with AMX after measuring with a `kind: benchmark` grid.", ""]


def page(folder):
    env = load(folder, "env.json")
    if not env:
        sys.exit(f"error: no env.json in {folder}: run scripts/bench/cpu_page.sh first")
    inference = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(folder, "inference_*.json")))]
    lines = (intro(env) + finetune_section(load(folder, "finetune.json")) +
             first_day_section(load(folder, "finetune_first_day.json"), load(folder, "env_first_day.json")) +
             inference_section(inference) +
             generate_section(load(folder, "generate.json")) + gemv_section(load(folder, "gemv.json")) +
             precision_section(load(folder, "precision.json"), env))
    return "\n".join(lines).rstrip("\n") + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measurements", default="docs/measurements/cpu")
    p.add_argument("--out", default="docs/performance-cpu.md")
    p.add_argument("--check", action="store_true", help="exit 1 if --out differs from what would be written")
    a = p.parse_args()
    text = page(a.measurements)
    if a.check:
        current = open(a.out).read() if os.path.exists(a.out) else ""
        if current != text:
            print(f"{a.out} differs from what scripts/bench/cpu_page.py writes from {a.measurements}", file=sys.stderr)
            return 1
        print(f"{a.out} matches {a.measurements}")
        return 0
    with open(a.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
