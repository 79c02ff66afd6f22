#!/usr/bin/env python3
"""The GPU facts of one lease, as a Markdown section of docs/performance.md.

    scripts/gpu/facts_page.py trace PROFILE_JSON[.gz] > DIR/graphed_trace_steps.json
    scripts/gpu/facts_page.py page DIR [--write PAGE | --check PAGE]

DIR holds commands.txt (the commands of the lease, one a line) and what
scripts/gpu/one_call.sh brought back: facts.txt, ctest-gpu.log (kept as ctest-gpu.txt,
since *.log files are ignored), clocks.csv and runs/*.json (each a
train_step_vs_pytorch.sh --json result). Each of these, where present, adds its part:
  profile_bf16_eager.txt, profile_bf16_graphed.txt, graphed_steps.jsonl and
  graphed_trace_steps.json   where the step's time goes: the eager and graphed profiles,
                             a graphed run's steps.jsonl (kept with KEEP_WORK=1) and the
                             per-replay device spans `trace` reads off its Chrome trace;
  realdata_{eager,graphed}.epochs.csv   the plan's realdata step: topics on the fly;
  bf16_weights.json          scripts/gpu/bf16_weights_vs_autocast.py --json;
  profile_bf16_eager_{unfused,fused}.txt   eager profiles without and with
                             model.fused_kernels: the fused kernels' device time against
                             the LayerNorm and dropout kernels they replace;
  step_kernels.txt           scripts/gpu/step_kernels.py's output;
  latency_{each_pass,once,once_fused}.csv   the plan's latency step: a benchmark
                             job's batch-1 cells with runtime.weight_casts each_pass,
                             once, and once with model.fused_kernels: true;
  hftrainer.json             the plan's hftrainer step (finetune_vs_hf_trainer.py --json):
                             the fine-tune against HF Trainer, and with it the table of
                             the GPU targets (docs/performance.md's summary);
  ctest-rerun.txt            a later call's rerun of some gpu tests, with each failure's
                             message.

With --write, the section replaces the one between PAGE's markers for DIR
(<!-- facts_page.py DIR begin --> and <!-- facts_page.py DIR end -->); with --check, the
command fails (exit 1) unless that section is what the files give.

`trace` groups the device's kernels, copies and memsets by the cudaGraphLaunch they
came from (Kineto's correlation id) and gives, per replay, the span from the first to
the last, their summed time and the gaps between them: a replay whose span is close to
its busy time kept the GPU fed.
"""
import csv
import gzip
import json
import os
import re
import statistics
import sys

# H100 and H200 SXM (the same chip and clocks), dense bf16 (NVIDIA's datasheets), as
# docs/performance.md's MFU figures.
BF16_PEAK_TFLOPS = 989.4
# The targets the GPU measurements are held to (docs/performance.md's summary).
TARGET_STEP_MS = 12.4  # bf16 step, bert-base s128 b64: 35% MFU
TARGET_VS_COMPILE = 0.9
TARGET_VS_HF = 0.5
TARGET_ACC_GAP = 0.005
TARGET_BATCH1_MS = 0.45
TARGET_BATCH128_SEQS = 10000
TARGET_SPREAD = 0.05


def read_json(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_steps(path):
    trace = read_json(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    device = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                    key=lambda e: e["ts"])
    launches = [e["args"]["correlation"] for e in events if e.get("name") == "cudaGraphLaunch"]
    steps = []
    for launch in launches:
        seg = [e for e in device if e.get("args", {}).get("correlation") == launch]
        if len(seg) < 2:
            continue
        gaps = [seg[j + 1]["ts"] - (seg[j]["ts"] + seg[j]["dur"]) for j in range(len(seg) - 1)]
        steps.append({"events": len(seg), "span_ms": (seg[-1]["ts"] + seg[-1]["dur"] - seg[0]["ts"]) / 1000,
                      "busy_ms": sum(e["dur"] for e in seg) / 1000, "median_gap_us": statistics.median(gaps),
                      "max_gap_us": max(gaps)})
    return {"graph_launches": len(launches), "device_events": len(device),
            "device_ms": sum(e["dur"] for e in device) / 1000, "steps": steps}


def profile_totals(path):
    """Host and device milliseconds per step, and the launch calls per step, from profile.txt."""
    text = open(path).read()
    host = re.search(r"host \(CPU\) time over (\d+) steps: ([\d.]+) ms, ([\d.]+) ms/step", text)
    device = re.search(r"device \(CUDA\) time over \d+ steps: ([\d.]+) ms, ([\d.]+) ms/step", text)
    steps = int(host.group(1))
    launches = sum(int(m.group(1)) for m in re.finditer(r"^(?:cudaLaunchKernel|cuLaunchKernelEx)\s+(\d+)", text, re.M))
    graph = re.search(r"^cudaGraphLaunch\s+(\d+)\s+([\d.]+)", text, re.M)
    return {"host_ms": float(host.group(3)), "device_ms": float(device.group(2)), "launches": launches / steps,
            "graph_launch_ms": float(graph.group(2)) if graph else None}


def tests_table(log, caption="(`ctest -L gpu`, 3 at a time, `scripts/gpu/one_call.sh`)"):
    rows = []
    for line in open(log):
        m = re.match(r"\s*\d+/\d+ Test +#\d+: (\S+) \.+\s*(\*\*\*)?(\w+)\s+([\d.]+) sec", line)
        if m:
            rows.append((m.group(1), m.group(3), float(m.group(4))))
    passed = sum(1 for _, state, _ in rows if state == "Passed")
    out = [f"{passed} of {len(rows)} passed {caption}:", "",
           "| test | result | seconds |", "|---|---|---|"]
    out += [f"| {name} | {state.lower()} | {sec:.1f} |" for name, state, sec in rows]
    return out


def exceptions(log):
    """(test, first line of the message) of each test a `ctest -V` log shows ending in a C++
    exception."""
    names, out = {}, []
    for line in open(log):
        m = re.match(r"\s*Start (\d+): (\S+)", line)
        if m:
            names[m.group(1)] = m.group(2)
        m = re.match(r'(\d+): C\+\+ exception with description "(.*)$', line.rstrip())
        if m:
            out.append((names.get(m.group(1), "test " + m.group(1)), m.group(2)))
    return out


def failures(log):
    """Each failed expectation in a `ctest -V` log (its lines prefixed with the test's
    number, interleaved when tests ran in parallel): test, what, measured, bound."""
    names, out, last = {}, [], {}
    for line in open(log):
        m = re.match(r"\s*Start (\d+): (\S+)", line)
        if m:
            names[m.group(1)] = m.group(2)
        m = re.match(r"(\d+): Expected: \(.+\) <= \(.+\), actual: (\S+) vs (\S+)", line)
        if m:
            last[m.group(1)] = (m.group(2), m.group(3))
            continue
        m = re.match(r"(\d+): (.+)$", line.rstrip())
        if m and m.group(1) in last:
            measured, bound = last.pop(m.group(1))
            out.append((names.get(m.group(1), "test " + m.group(1)), m.group(2), measured, bound))
    return out


def read_runs(runs_dir):
    return [(name[:-5], json.load(open(os.path.join(runs_dir, name))))
            for name in sorted(os.listdir(runs_dir)) if name.endswith(".json")]


def run_kind(r):
    return (("graphed" if r["cuda_graph"] else "eager") + (", fused" if r.get("fused") else "") +
            (", bf16 weights" if r.get("bf16_weights") else ""))


def spread_table(runs):
    """Every timed run, then per kind (eager or graphed, fused or not) the range and median.
    A run with --no-reference has no PyTorch time."""
    waits = any("ours_wait_ms" in r for _, r in runs)
    fused = any(r.get("fused") for _, r in runs)
    out = ["| run | cuda_graph | " + ("fused kernels | " if fused else "") + "ours ms/step | " +
           ("of which data wait | " if waits else "") + "PyTorch eager ms/step (same run) | ours / eager |",
           "|---|---|---|---|---|" + ("---|" if waits else "") + ("---|" if fused else "")]
    for name, r in runs:
        wait = f" {r['ours_wait_ms']:.2f} |" if waits else ""
        fuse = f" {str(bool(r.get('fused'))).lower()} |" if fused else ""
        ref = (f" {r['pytorch_ms']:.2f} | {r['ours_ms'] / r['pytorch_ms']:.3f} |" if r.get("pytorch_ms")
               else " (not run) | |")
        out.append(f"| {name} | {str(r['cuda_graph']).lower()} |{fuse} {r['ours_ms']:.2f} |{wait}{ref}")
    out.append("")
    medians = {}
    kinds = ["eager", "eager, fused", "graphed", "graphed, fused"]
    kinds += [k for k in dict.fromkeys(run_kind(r) for _, r in runs) if k not in kinds]
    for kind in kinds:
        ours = [r["ours_ms"] for _, r in runs if run_kind(r) == kind]
        ref = [r["pytorch_ms"] for _, r in runs if run_kind(r) == kind and r.get("pytorch_ms")]
        if not ours:
            continue
        medians[kind] = statistics.median(ours)
        line = (f"- {kind}: ours {min(ours):.1f} to {max(ours):.1f} ms (median {statistics.median(ours):.1f}, "
                f"spread {(max(ours) - min(ours)) / statistics.median(ours):.1%})")
        if ref:
            line += (f"; PyTorch eager in the same runs {min(ref):.1f} to {max(ref):.1f} ms (median "
                     f"{statistics.median(ref):.1f}, spread {(max(ref) - min(ref)) / statistics.median(ref):.1%})")
        out.append(line + ".")
    for kind in ("eager", "graphed"):
        if kind in medians and kind + ", fused" in medians:
            out.append(f"- {kind.capitalize()}, the fused kernels against the unfused layers in the same call: "
                       f"{medians[kind + ', fused']:.2f} ms against {medians[kind]:.2f} ms, "
                       f"{medians[kind + ', fused'] / medians[kind]:.3f}x.")
    return out


def profile_rows(path, pattern):
    """(device ms per step, [(kernel, calls, ms per step, us per call)]) of a profile.txt's
    device table, for the kernels whose (shortened) names match pattern."""
    text = open(path).read()
    m = re.search(r"^device \(CUDA\) time over \d+ steps: [\d.]+ ms, ([\d.]+) ms/step", text, re.M)
    rows = []
    for line in text[m.end():].splitlines() if m else []:
        f = re.match(r"(.+?)\s{2,}(\d+)\s+([\d.]+)\s+[\d.]+%\s+[\d.]+\s+([\d.]+)$", line)
        if f and re.search(pattern, f.group(1)):
            rows.append((f.group(1).strip(), int(f.group(2)), float(f.group(3)), float(f.group(4))))
    return (float(m.group(1)) if m else None), rows


# The kernels fused_add_norm.cu replaces: LayerNorm's forward and backward, and dropout's.
UNFUSED_NORM = r"layer_norm|vectorized_laye|GammaBeta|fused_dropout"


def fused_kernels_table(folder):
    out = ["| eager profile | device ms/step | kernel | calls | ms/step | us/call |", "|---|---|---|---|---|---|"]
    for name, pattern in (("profile_bf16_eager_unfused.txt", UNFUSED_NORM), ("profile_bf16_eager_fused.txt", "AddNorm")):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        total, rows = profile_rows(path, pattern)
        label = "fused" if "_fused" in name else "unfused"
        for i, (kernel, calls, ms, us) in enumerate(rows):
            out.append(f"| {label if i == 0 else ''} | {f'{total:.2f}' if i == 0 else ''} | `{kernel}` | {calls} | "
                       f"{ms:.3f} | {us:.1f} |")
    out += ["", "Each profile covers 5 steps of the eager bf16 step (`--profile`); the unfused rows are "
            "LayerNorm's and dropout's own kernels, without the residual add and the mask's multiply, "
            "which share ATen's generic elementwise kernels with other layers."]
    return out


def graphed_without_reference(runs):
    """The graphed step's median when most runs timed the worker alone (--no-reference):
    against the peak, PyTorch eager and torch.compile where a run timed them, and the
    fp32 weights' autocast casts against bf16 weights with fp32 masters."""
    params = next((r["non_embedding_params"] for _, r in runs if r.get("non_embedding_params")), None)
    graphed = [r for _, r in runs if r["cuda_graph"] and not r.get("bf16_weights")]
    masters = [r["ours_ms"] for _, r in runs if r["cuda_graph"] and r.get("bf16_weights")]
    if not graphed or not params:
        return []
    ours = statistics.median(r["ours_ms"] for r in graphed)
    flops = step_flops(params, graphed[0]["batch"], graphed[0]["seq"])
    out = [f"- The graphed step's median over {len(graphed)} runs, {ours:.2f} ms, is "
           f"{flops / (ours / 1000) / 1e12 / BF16_PEAK_TFLOPS:.1%} MFU ({flops / 1e12:.2f} TFLOP a step, against "
           f"{BF16_PEAK_TFLOPS} TFLOP/s dense bf16)."]
    for r in graphed:
        if r.get("pytorch_ms"):
            out.append(f"- Against PyTorch eager in the same run: {r['ours_ms']:.2f} ms against {r['pytorch_ms']:.2f} "
                       f"ms, {r['ours_ms'] / r['pytorch_ms']:.3f}x.")
        if r.get("compiled_ms"):
            out.append(f"- Against `torch.compile(mode=\"{r['compile_mode']}\")` in the same run: {r['ours_ms']:.2f} "
                       f"ms against {r['compiled_ms']:.2f} ms, {r['ours_ms'] / r['compiled_ms']:.3f}x.")
    if masters:
        m = statistics.median(masters)
        out.append(f"- With `train.bf16_weights` (bf16 product weights, fp32 masters in AdamW) the graphed step's "
                   f"median over {len(masters)} runs is {m:.2f} ms, {m / ours:.3f}x the autocast step's; that is "
                   f"{flops / (m / 1000) / 1e12 / BF16_PEAK_TFLOPS:.1%} MFU.")
    return out


def graphed_against_targets(runs):
    """The graphed step's median against PyTorch eager, torch.compile and the peak."""
    graphed = [r for _, r in runs if r["cuda_graph"] and r.get("pytorch_ms") and r.get("non_embedding_params")]
    # Runs from before the benchmark printed the data wait were bound by the loader.
    if len(graphed) < 2 and all(r.get("ours_wait_ms", 1e9) < 1.0 for _, r in runs if r["cuda_graph"]):
        return graphed_without_reference(runs)
    if len(graphed) < 2 or not all(r.get("ours_wait_ms", 1e9) < 1.0 for r in graphed):
        return []
    ours = statistics.median(r["ours_ms"] for r in graphed)
    ratios = [r["ours_ms"] / r["pytorch_ms"] for r in graphed]
    flops = step_flops(graphed[0]["non_embedding_params"], graphed[0]["batch"], graphed[0]["seq"])
    out = [f"- The graphed step's median, {ours:.2f} ms, is {flops / (ours / 1000) / 1e12 / BF16_PEAK_TFLOPS:.1%} "
           f"MFU ({flops / 1e12:.2f} TFLOP a step, against {BF16_PEAK_TFLOPS} TFLOP/s dense bf16). Against PyTorch "
           f"eager in the same runs it is {statistics.median(ratios):.3f}x (median; {min(ratios):.3f} to "
           f"{max(ratios):.3f}x run by run)."]
    for r in graphed:
        if r.get("compiled_ms"):
            out.append(f"- Against `torch.compile(mode=\"{r['compile_mode']}\")` in the same run: {r['ours_ms']:.2f} "
                       f"ms against {r['compiled_ms']:.2f} ms, {r['ours_ms'] / r['compiled_ms']:.3f}x.")
    return out


def realdata_table(folder, runs):
    out = ["| run | epoch | steps | ms/step (mean) | data wait % | forward ms | backward ms |", "|---|---|---|---|---|---|---|"]
    means = {}
    for kind in ("eager", "graphed"):
        path = os.path.join(folder, f"realdata_{kind}.epochs.csv")
        if not os.path.exists(path):
            continue
        for row in csv.DictReader(open(path)):
            means[kind] = float(row["ms_per_step"])  # the last epoch's: no first-time shapes left
            out.append(f"| {kind} | {row['epoch']} | {row['steps']} | {float(row['ms_per_step']):.2f} | "
                       f"{float(row['data_wait_pct']):.2f} | {float(row['forward_ms']):.2f} | "
                       f"{float(row['backward_ms']):.2f} |")
    synthetic = [r["ours_ms"] for _, r in runs if r["cuda_graph"]]
    if "graphed" in means and synthetic:
        out += ["", f"- The graphed last epoch's mean step, {means['graphed']:.2f} ms, is "
                f"{means['graphed'] / statistics.median(synthetic):.2f}x the synthetic graphed step's median "
                f"({statistics.median(synthetic):.2f} ms, every row 128 tokens long)."]
    return out


def latency_table(folder):
    """latency_{each_pass,once,once_fused}.csv (one_call.sh's latency step): p50 and
    sequences a second by cell, each setting beside the weights cast on every pass."""
    settings = (("each_pass", "weights cast each pass"), ("once", "cast once"),
                ("once_fused", "cast once, fused kernels"))
    cells = {}
    for setting, _ in settings:
        path = os.path.join(folder, f"latency_{setting}.csv")
        if not os.path.exists(path):
            continue
        for row in csv.DictReader(open(path)):
            if row["status"] == "ok":
                key = (int(row["batch"]), row["precision"], row["mode"])
                cells.setdefault(key, {})[setting] = (float(row["p50_ms"]), float(row["seqs_per_s"]))
    header = ["batch", "precision", "mode"] + [f"p50 ms, {title}" for _, title in settings]
    header += [f"{setting} / each pass" for setting, _ in settings[1:]] + ["seq/s, best"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (batch, precision, mode), cell in sorted(cells.items()):
        each = cell.get("each_pass", (None,))[0]
        values = [str(cell[s][0]) if s in cell else "-" for s, _ in settings]
        ratios = [f"{cell[s][0] / each:.3f}" if each and s in cell else "-" for s, _ in settings[1:]]
        best = f"{max(v[1] for v in cell.values()):,.0f}"
        out.append("| " + " | ".join([str(batch), precision, mode] + values + ratios + [best]) + " |")
    return out


HF_SYSTEMS = {"hf_grouped": "Trainer, bf16, group_by_length", "hf_compiled": "Trainer, bf16, group_by_length, "
              "torch_compile", "hf_default": "Trainer, bf16, default sampler"}


def hftrainer_table(path):
    """finetune_vs_hf_trainer.py's --json of the plan's hftrainer step: per system, the wall
    time from launch to exit, the time to the target accuracy and the final dev accuracy."""
    report = json.load(open(path))
    out = []
    for task, r in report.items():
        out += [f"{task}, dev accuracy target {r['target_acc']:.4f} (the lowest final accuracy of the finished runs); "
                f"Trainer's optimizer {r.get('hf_optimizer')}, transformers {r.get('transformers')}:", "",
                "| system | wall s | to target s | dev accuracy by epoch | steps | ours / this |",
                "|---|---|---|---|---|---|"]
        ours = r["systems"]["trainyard"]["wall_s"]
        for system, row in r["systems"].items():
            name = "ours, bf16, whole-step CUDA graphs" if system == "trainyard" else HF_SYSTEMS.get(system, system)
            finished = row["wall_s"] == row["wall_s"]
            wall = f"{row['wall_s']:.1f}" if finished else str(row["walls"][0])
            target = f"{row['to_target_s']:.1f}" if row["to_target_s"] == row["to_target_s"] else "-"
            accs = ", ".join(f"{a:.4f}" for a in (row.get("epoch_accs") or [[]])[0]) or (
                f"{row['final_acc']:.4f} (final)" if row["final_acc"] == row["final_acc"] else "-")
            ratio = f"{ours / row['wall_s']:.3f}" if finished and ours == ours and system != "trainyard" else ""
            out.append(f"| {name} | {wall} | {target} | {accs} | {row['steps'] or '-'} | {ratio} |")
    return out


def latency_best(folder, batch, key):
    """The best CUDA-graph cell of a batch size in the latency CSVs: the lowest p50 (ms)
    with key "p50_ms", the most sequences a second with "seqs_per_s"; with the cell's name."""
    best = None
    for setting in ("each_pass", "once", "once_fused"):
        path = os.path.join(folder, f"latency_{setting}.csv")
        for row in csv.DictReader(open(path)) if os.path.exists(path) else []:
            if row["status"] == "ok" and row["mode"] == "cuda_graph" and int(row["batch"]) == batch:
                value = float(row[key]) if key == "p50_ms" else -float(row[key])
                cell = (value, f"{row['precision']}, {setting}")
                best = min(best, cell) if best else cell
    return best


def targets_table(folder, runs):
    """Each target beside what this lease measured, from the same files as the sections."""
    params = next((r["non_embedding_params"] for _, r in runs if r.get("non_embedding_params")), None)
    graphed = [r["ours_ms"] for _, r in runs if r["cuda_graph"] and not r.get("bf16_weights")]
    masters = [r["ours_ms"] for _, r in runs if r["cuda_graph"] and r.get("bf16_weights")]
    compiled = [r for _, r in runs if r.get("compiled_ms")]
    rows = []

    def row(target, goal, measured, met):
        rows.append(f"| {target} | {goal} | {measured} | {'yes' if met else 'no' if met is not None else '-'} |")

    if graphed:
        step = statistics.median(graphed)
        best = min(step, statistics.median(masters)) if masters else step
        mfu = step_flops(params, 64, 128) / (best / 1000) / 1e12 / BF16_PEAK_TFLOPS if params else None
        row("bf16 step, bert-base s128 b64", f"<= {TARGET_STEP_MS} ms (35% MFU)",
            f"{step:.2f} ms" + (f"; {statistics.median(masters):.2f} ms with bf16 weights" if masters else "") +
            (f" ({mfu:.1%} MFU)" if mfu else ""), best <= TARGET_STEP_MS)
        spread = (max(graphed) - min(graphed)) / step
        row("spread of the graphed step across runs", f"< {TARGET_SPREAD:.0%}",
            f"{spread:.1%} over {len(graphed)} runs", spread < TARGET_SPREAD)
    for r in compiled:
        ratio = r["ours_ms"] / r["compiled_ms"]
        row(f"against torch.compile({r['compile_mode']})", f"<= {TARGET_VS_COMPILE}x",
            f"{ratio:.3f}x ({r['ours_ms']:.2f} against {r['compiled_ms']:.2f} ms)", ratio <= TARGET_VS_COMPILE)
    hf = os.path.join(folder, "hftrainer.json")
    for task, r in (json.load(open(hf)).items() if os.path.exists(hf) else []):
        ours = r["systems"]["trainyard"]
        done = {s: v for s, v in r["systems"].items() if s != "trainyard" and v["wall_s"] == v["wall_s"]}
        if not done:
            continue
        fastest = min(done, key=lambda s: done[s]["wall_s"])
        ratio = ours["wall_s"] / done[fastest]["wall_s"]
        # The accuracy is held against Trainer's default sampler where it ran: its length-
        # grouped one trains each mega-batch's batches in length order and learns slower.
        acc_ref = "hf_default" if "hf_default" in done else fastest
        gap = abs(ours["final_acc"] - done[acc_ref]["final_acc"])
        row(f"{task} fine-tune against Trainer's fastest finished setting ({HF_SYSTEMS.get(fastest, fastest)})",
            f"<= {TARGET_VS_HF}x its wall time, dev accuracy within {TARGET_ACC_GAP} of Trainer's",
            f"{ratio:.3f}x ({ours['wall_s']:.1f} against {done[fastest]['wall_s']:.1f} s); accuracy "
            f"{ours['final_acc']:.4f} against {done[acc_ref]['final_acc']:.4f} ({HF_SYSTEMS.get(acc_ref, acc_ref)})",
            ratio <= TARGET_VS_HF and gap <= TARGET_ACC_GAP)
    best = latency_best(folder, 1, "p50_ms")
    if best:
        row("inference, batch 1, seq 128", f"<= {TARGET_BATCH1_MS} ms", f"{best[0]:.3f} ms ({best[1]})",
            best[0] <= TARGET_BATCH1_MS)
    best = latency_best(folder, 128, "seqs_per_s")
    if best:
        row("inference, batch 128, seq 128", f">= {TARGET_BATCH128_SEQS:,} seq/s", f"{-best[0]:,.0f} seq/s "
            f"({best[1]})", -best[0] >= TARGET_BATCH128_SEQS)
    else:
        row("inference, batch 128, seq 128", f">= {TARGET_BATCH128_SEQS:,} seq/s", "not measured in this lease", None)
    return ["| target | goal | measured | met |", "|---|---|---|---|"] + rows


def kernel_kinds(path):
    """The kind tables of step_kernels.txt: {variant: (ms, kernels, [(kind, ms)])}."""
    variants, current = {}, None
    for line in open(path):
        m = re.match(r"=== (\w+): ([\d.]+) ms of kernels per step, (\d+) kernels per step", line)
        if m:
            current = m.group(1)
            variants[current] = (float(m.group(2)), int(m.group(3)), [])
            continue
        m = re.match(r"(\S.*?)\s+([\d.]+)\s+([\d.]+)%$", line.rstrip())
        if current and m:
            variants[current][2].append((m.group(1), float(m.group(2))))
        elif line.startswith("kernel (top"):
            current = None
    return variants


def kernels_table(path):
    variants = kernel_kinds(path)
    names = list(variants)
    kinds = []
    for name in names:
        kinds += [k for k, _ in variants[name][2] if k not in kinds]
    out = ["| kind | " + " | ".join(f"{n} ms/step" for n in names) + " |", "|---|" + "---|" * len(names)]
    for kind in kinds:
        cells = [f"{dict(variants[n][2]).get(kind, 0.0):.2f}" for n in names]
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    out.append("| **all kernels** | " + " | ".join(f"**{variants[n][0]:.2f}** ({variants[n][1]} kernels)"
                                                   for n in names) + " |")
    return out


def clocks_summary(path):
    with open(path) as f:
        rows = [r for r in csv.reader(f) if len(r) == 7][1:]
    busy = [r for r in rows if int(r[5].split()[0]) > 0]
    reasons = sorted({r[6].strip() for r in busy})
    sm = sorted({int(r[1].split()[0]) for r in busy})
    return (f"nvidia-smi every 200 ms ({len(rows)} samples): whenever the GPU was busy ({len(busy)} samples) the SM "
            f"clock read {', '.join(map(str, sm))} MHz and the active clock-event reasons were {', '.join(reasons)} "
            f"(0x1 is only 'GPU idle'; no power, thermal or sync-boost cap); utilisation while busy, median "
            f"{statistics.median(int(r[5].split()[0]) for r in busy)}%.")


def step_flops(params, batch, seq, layers=12, hidden=768):
    """Training FLOPs of one step: 6 per parameter per token, plus attention's two products."""
    return 6 * params * batch * seq + 3 * 4 * layers * batch * seq * seq * hidden


def where_time_goes(folder, params):
    eager = profile_totals(os.path.join(folder, "profile_bf16_eager.txt"))
    graphed = profile_totals(os.path.join(folder, "profile_bf16_graphed.txt"))
    trace = json.load(open(os.path.join(folder, "graphed_trace_steps.json")))
    steps = [json.loads(line) for line in open(os.path.join(folder, "graphed_steps.jsonl"))]
    flops = step_flops(params, 64, 128)
    full = [s for s in trace["steps"] if s["events"] > 500]
    span = statistics.median(s["span_ms"] for s in full)
    unwaited = [s for s in steps if s["wait_ms"] < 1.0]

    def listed(values):
        return ", ".join(f"{v:.1f}" for v in values)

    out = ["", "### Where the bf16 step's time goes (bert-base, seq 128, batch 64)", "",
           "| step | host ms/step | device ms/step (kernels summed) | launches/step | graph launch ms |",
           "|---|---|---|---|---|",
           f"| eager | {eager['host_ms']:.1f} | {eager['device_ms']:.1f} | {eager['launches']:.0f} | - |",
           f"| whole-step CUDA graph | {graphed['host_ms']:.1f} | {graphed['device_ms']:.1f} | "
           f"{graphed['launches']:.0f} | {graphed['graph_launch_ms']:.2f} |", "",
           f"- Eager, the host needs {eager['host_ms']:.1f} ms to launch a step whose kernels take "
           f"{eager['device_ms']:.1f} ms: the step is launch-bound, at about "
           f"{eager['host_ms'] / eager['launches'] * 1000:.0f} us of host time per launch.",
           f"- Graphed, a replay's kernels run back to back: over the {len(full)} whole replays in the trace the "
           f"span from first to last kernel was {listed(s['span_ms'] for s in full)} ms for "
           f"{listed(s['busy_ms'] for s in full)} ms of kernels, with a median gap of "
           f"{statistics.median(s['median_gap_us'] for s in full):.1f} us.",
           f"- That is {flops / 1e12:.2f} TFLOP a step ({params / 1e6:.1f} M non-embedding parameters, 8,192 tokens): "
           f"{flops / (span / 1000) / 1e12 / BF16_PEAK_TFLOPS:.1%} MFU at the graphed replay's median span of "
           f"{span:.1f} ms, against {BF16_PEAK_TFLOPS} TFLOP/s dense bf16."]
    if unwaited:
        out.append(f"- The graphed run's logged steps without data wait took "
                   f"{listed(s['ms'] for s in unwaited)} ms; the others waited "
                   f"{listed(s['wait_ms'] for s in steps if s['wait_ms'] >= 1.0)} ms for their batch: "
                   "one loader thread tokenized a batch of these 2,000-character texts in about 50 ms.")
    return out


def bf16_weights_line(path):
    r = json.load(open(path))
    a, w = r["autocast"], r["bf16_weights"]
    return [f"PyTorch's own whole-step graph ({r['preset']}, batch {r['batch']} x seq {r['seq']}, torch {r['torch']}), "
            f"median of {len(a['rounds_ms'])} rounds: autocast with fp32 weights {a['ms_per_step']:.2f} ms/step, bf16 "
            f"product weights with fp32 masters {w['ms_per_step']:.2f} ms/step: "
            f"{w['ms_per_step'] / a['ms_per_step']:.3f}x. Both losses fell over the first replays "
            f"({a['losses'][0]:.3f} to {a['losses'][-1]:.3f}, and {w['losses'][0]:.3f} to {w['losses'][-1]:.3f})."]


def page(folder):
    facts = open(os.path.join(folder, "facts.txt")).read()
    date = re.search(r"^date:\s+(\S+)", facts, re.M).group(1)
    _, gpu, driver = [part.strip() for part in re.search(r"^gpus:\s+(.+)$", facts, re.M).group(1).split(",")[:3]]
    torch_version, cuda = re.search(r"^torch:\s+(\S+), built for CUDA ([\d.]+)", facts, re.M).groups()
    commands = [line.strip() for line in open(os.path.join(folder, "commands.txt")) if line.strip()]
    runs = read_runs(os.path.join(folder, "runs"))

    def present(name):
        return os.path.exists(os.path.join(folder, name))

    out = [f"Measured on {date[:10]} on a lent {gpu} (driver {driver}, CUDA {cuda}, torch {torch_version}) by:", ""]
    out += [f"- `{c}`" for c in commands]
    out += ["", f"The files are in `{folder}`, and this section is `scripts/gpu/facts_page.py page {folder}`.", ""]
    if present("hftrainer.json"):
        out += ["### Against the targets", ""] + targets_table(folder, runs) + [""]
    out += ["### Tests on the GPU", ""] + tests_table(os.path.join(folder, "ctest-gpu.txt"))
    if present("ctest-rerun.txt"):
        out += ["", "A later call of the lease ran some of them again:", ""]
        out += tests_table(os.path.join(folder, "ctest-rerun.txt"), "(`ctest -L gpu`, the later call)")
    for log in ("ctest-gpu.txt", "ctest-rerun.txt"):
        thrown = {}
        for test, what in exceptions(os.path.join(folder, log)) if present(log) else []:
            thrown.setdefault(what, []).append(test)
        for what, tests in thrown.items():
            out += ["", f"In `{log}`, {len(tests)} threw `{what}`: {', '.join(sorted(tests))}."]
    if present("profile_bf16_eager.txt"):
        out += where_time_goes(folder, runs[0][1]["non_embedding_params"])
    if runs:
        out += ["", "### Run to run (bf16, bert-base, seq 128, batch 64)", ""] + spread_table(runs)
        out += graphed_against_targets(runs)
    if any(present(f"latency_{s}.csv") for s in ("each_pass", "once", "once_fused")):
        out += ["", "### Inference latency (bert-base, seq 128; `runtime.weight_casts`, `model.fused_kernels`)", ""] + latency_table(folder)
    if present("hftrainer.json"):
        out += ["", "### The fine-tune against Hugging Face Trainer on this GPU", ""]
        out += hftrainer_table(os.path.join(folder, "hftrainer.json"))
    if present("realdata_graphed.epochs.csv") or present("realdata_eager.epochs.csv"):
        out += ["", "### Fine-tuning on real data (topics tokenized on the fly, bf16, batch 64)", ""]
        out += realdata_table(folder, runs)
    if present("step_kernels.txt"):
        out += ["", "### PyTorch's step by kernel kind: as launched, and fused by Inductor", ""]
        out += kernels_table(os.path.join(folder, "step_kernels.txt"))
    if present("ctest-fused.txt"):
        out += ["", "### The fused dropout+residual+LayerNorm kernels on the GPU", ""]
        out += tests_table(os.path.join(folder, "ctest-fused.txt"), "(`ctest -L gpu -R FusedAddNorm`)")
        fails = failures(os.path.join(folder, "ctest-fused.txt"))
        if fails:
            out += [""] + [f"- {test}: {what}, {measured} against the bound {bound}" for test, what, measured, bound
                           in fails]
        spread = open(os.path.join(folder, "fused-call-spread.txt")).read()
        m = re.search(r"trainyard worker \(C\+\+\)\s+([\d.]+) ms/step", spread)
        if m:
            out.append(f"- The same call's graphed step without the fused kernels: {float(m.group(1)):.2f} ms.")
    if present("profile_bf16_eager_fused.txt"):
        out += ["", "### The fused dropout+residual+LayerNorm kernels' device time", ""] + fused_kernels_table(folder)
    if present("bf16_weights.json"):
        out += ["", "### bf16 weights against autocast's casts", ""] + bf16_weights_line(os.path.join(folder, "bf16_weights.json"))
    out += ["", clocks_summary(os.path.join(folder, "clocks.csv"))]
    return "\n".join(out)


def place(folder, page_path, write):
    text = open(page_path).read()
    begin, end = f"<!-- facts_page.py {folder} begin -->\n", f"<!-- facts_page.py {folder} end -->"
    if begin not in text or end not in text:
        print(f"{page_path}: no markers for {folder}", file=sys.stderr)
        return 1
    head, rest = text.split(begin, 1)
    old, tail = rest.split(end, 1)
    new = page(folder) + "\n"
    if write:
        open(page_path, "w").write(head + begin + new + end + tail)
        return 0
    if old != new:
        print(f"{page_path}: the section for {folder} differs from `scripts/gpu/facts_page.py page {folder}`",
              file=sys.stderr)
        return 1
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "trace":
        json.dump(trace_steps(sys.argv[2]), sys.stdout, indent=1)
        print()
    elif len(sys.argv) == 3 and sys.argv[1] == "page":
        print(page(sys.argv[2].rstrip("/")))
    elif len(sys.argv) == 5 and sys.argv[1] == "page" and sys.argv[3] in ("--write", "--check"):
        sys.exit(place(sys.argv[2].rstrip("/"), sys.argv[4], sys.argv[3] == "--write"))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
