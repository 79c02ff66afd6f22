#!/usr/bin/env python3
"""Turns scripts/gpu/measure.sh's measurements.json into the markdown tables of
docs/performance.md. Model-FLOPs utilisation is 6 x non-embedding parameters x tokens
per step / step time / the GPU's dense peak for that precision (NVIDIA's datasheet
figures, named in the output); it is left out for a GPU not in PEAKS."""
import json
import sys

# Dense tensor-core peaks in TFLOP/s (fp32 without TF32: the CUDA cores' rate).
PEAKS = {
    "H100 PCIe": {"fp32": 51.2, "fp32_tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 66.9, "fp32_tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5
    "H200": {"fp32": 66.9, "fp32_tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
}
LABELS = {"fp32": "fp32 (TF32 off)", "fp32_tf32": "fp32 (TF32 on)", "bf16": "bf16 autocast",
          "fp16": "fp16 autocast + loss scaling",
          "bf16_graph": "bf16, whole-step CUDA graphs (compiled: reduce-overhead)"}


def peaks_for(gpu):
    for name, peaks in PEAKS.items():
        if name in gpu:
            return name, peaks
    return None, None


def finetune(results, gpu):
    name, peaks = peaks_for(gpu)
    out = ["## Fine-tune step: bert-base, seq 128", "",
           "ms/step, median over steps 11..60 (CUDA events; the worker reads them once per 10 steps). "
           "Reference: HF `BertForSequenceClassification` in a plain PyTorch loop (AdamW, clipping, "
           "GradScaler for fp16), eager and `torch.compile`, same batches.", "",
           "| batch | precision | ours ms | PyTorch eager ms | ours / eager | torch.compile ms | ours / compiled "
           "| MFU ours | MFU eager |", "|---|---|---|---|---|---|---|---|---|"]
    for batch in (32, 64):
        for config in ("fp32", "fp32_tf32", "bf16", "fp16", "bf16_graph"):
            r = results.get(f"finetune_b{batch}_{config}")
            if not r:
                continue
            flops = 6 * r["non_embedding_params"] * r["batch"] * r["seq"]
            peak = peaks[config.replace("_graph", "")] if peaks else None
            mfu = (lambda ms: f"{100 * flops / (ms / 1e3) / (peak * 1e12):.1f}%") if peaks else (lambda ms: "-")
            compiled = r.get("compiled_ms")
            compiled_ms = f"{compiled:.2f}" if compiled else "-"
            compiled_ratio = f"{r['ours_ms'] / compiled:.3f}" if compiled else "-"
            out.append(f"| {batch} | {LABELS[config]} | {r['ours_ms']:.2f} | {r['pytorch_ms']:.2f} | "
                       f"{r['ours_ms'] / r['pytorch_ms']:.3f} | {compiled_ms} | {compiled_ratio} | "
                       f"{mfu(r['ours_ms'])} | {mfu(r['pytorch_ms'])} |")
    if peaks:
        out += ["", f"MFU against the {name} datasheet's dense peaks (TFLOP/s): " +
                ", ".join(f"{LABELS[k]} {v}" for k, v in peaks.items() if k in LABELS) + "."]
    return out


def datawait(results):
    r = results.get("datawait")
    if not r:
        return []
    return ["## Data wait", "", "bert-base, topics train split tokenized on the fly by the loader threads, bf16, "
            "batch 64, seq 128, 300 steps:", "",
            "| ms/step | wait ms | data wait | h2d ms | forward ms | backward ms | optimizer ms | samples/s |",
            "|---|---|---|---|---|---|---|---|",
            f"| {r['ms_per_step']:.2f} | {r['wait_ms']:.3f} | {r['data_wait_pct']:.2f}% | {r['h2d_ms']:.3f} | "
            f"{r['forward_ms']:.2f} | {r['backward_ms']:.2f} | {r['optimizer_ms']:.2f} | {r['samples_per_s']:.0f} |"]


def inference(results):
    r = results.get("inference")
    if not r:
        return []
    out = ["## Inference grid: bert-base", "",
           "Mean ms per batch (worker: CUDA events, 100 iterations after 10 warm-up, re-measured when noisy); "
           "PyTorch: HF eager on the same inputs under the same autocast.", ""]
    cells = {(c["precision"], c["mode"], int(c["batch"]), int(c["seq_len"])): c for c in r["cells"]}
    for precision in ("fp32", "bf16", "fp16"):
        ref = r["pytorch_eager_mean_ms"][precision]
        out += [f"### {precision}", "", "| batch x seq | ours eager | ours cuda_graph | PyTorch eager | eager / pt | "
                "graph / pt |", "|---|---|---|---|---|---|"]
        for batch in (1, 2, 4, 8):
            for seq in (8, 64, 128, 256, 512):
                e, g = cells.get((precision, "eager", batch, seq)), cells.get((precision, "cuda_graph", batch, seq))
                pt = ref.get(f"{batch}x{seq}")
                if not (e and g and pt) or e["status"] != "ok" or g["status"] != "ok":
                    continue
                em, gm = float(e["mean_ms"]), float(g["mean_ms"])
                out.append(f"| {batch} x {seq} | {em:.3f} | {gm:.3f} | {pt:.3f} | {em / pt:.3f} | {gm / pt:.3f} |")
        out.append("")
    for precision in ("fp32", "bf16", "fp16"):
        c = cells.get((precision, "cuda_graph", 1, 128))
        if c and c["status"] == "ok":
            out.append(f"Batch-1 latency at seq 128 with CUDA graphs, {precision}: p50 {float(c['p50_ms']):.3f} ms, "
                       f"p99 {float(c['p99_ms']):.3f} ms.")
    return out


def sorted_gain(results):
    r = results.get("sorted")
    if not r:
        return []
    f, s = r["passes"]["file order"], r["passes"]["sorted by length"]
    return ["", "## Sorted batching", "", "bert-base, bf16, topics test split, batch 64, max length 512:", "",
            "| order | texts/s | padding |", "|---|---|---|",
            f"| file order | {f['texts_per_s']:.1f} | {f['padding_pct']:.1f}% |",
            f"| sorted by length | {s['texts_per_s']:.1f} | {s['padding_pct']:.1f}% |", "",
            f"Gain: {r['sorted_speedup']:.2f}x; predictions identical: {r['orders_agree']}."]


def generate(results):
    r = results.get("generate")
    if not r:
        return []
    out = ["", "## Generation: GPT-2 small shape", "",
           "Greedy, 32-token prompts, 64 new tokens, every row generating them all. Ours: a benchmark job's "
           "generate cells (median time to first token; decoded tokens/s from the mean decode step), eager and "
           "with decode steps replayed from one CUDA graph; HF: `generate()` under the same autocast, medians "
           "of 5 (`scripts/bench/generate_reference.py`).", "",
           "| precision | batch | first token ms, ours / HF | tok/s eager | tok/s cuda_graph | tok/s HF | "
           "graph / HF |", "|---|---|---|---|---|---|---|"]
    cells = {(c["precision"], c["mode"], int(c["batch"])): c for c in r["cells"] if c["status"] == "ok"}
    for precision in ("fp32", "bf16", "fp16"):
        for batch in (1, 8):
            e, g = cells.get((precision, "generate", batch)), cells.get((precision, "generate_cuda_graph", batch))
            hf = r["hf"][precision].get(str(batch))
            if not (e and g and hf):
                continue
            out.append(f"| {precision} | {batch} | {float(g['first_token_ms']):.1f} / {hf['first_token_ms']:.1f} | "
                       f"{float(e['tokens_per_s']):.0f} | {float(g['tokens_per_s']):.0f} | "
                       f"{hf['tokens_per_s']:.0f} | {float(g['tokens_per_s']) / hf['tokens_per_s']:.2f}x |")
    return out


def main():
    results = json.load(open(sys.argv[1]))
    m = results.get("machine", {})
    lines = ["# Performance on a GPU", "",
             f"Machine: {m.get('gpu', '?')} ({m.get('nvidia_smi', '?')}); torch {m.get('torch', '?')}, "
             f"CUDA {m.get('cuda', '?')}, cuDNN {m.get('cudnn', '?')}. Commands: `scripts/gpu/measure.sh` "
             "(each row names its bench script's arguments in the run's log).", ""]
    lines += finetune(results, m.get("gpu", "")) + [""] + datawait(results) + [""] + inference(results)
    lines += sorted_gain(results) + generate(results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
