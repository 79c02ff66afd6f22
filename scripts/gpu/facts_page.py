#!/usr/bin/env python3
"""The GPU facts of one lease, as a Markdown section of docs/performance.md.

    scripts/gpu/facts_page.py trace PROFILE_JSON[.gz] > DIR/graphed_trace_steps.json
    scripts/gpu/facts_page.py page DIR [--write PAGE | --check PAGE]

DIR holds what scripts/gpu/one_call.sh brings back (facts.txt, ctest-gpu.log, kept as
ctest-gpu.txt since *.log files are ignored,
clocks.csv, profile_bf16_eager.txt, runs/*.json, each a train_step_vs_pytorch.sh
--json result) and, from a graphed run of that benchmark kept with KEEP_WORK=1, its
profile.txt (as profile_bf16_graphed.txt), steps.jsonl (graphed_steps.jsonl) and the
per-step device spans that `trace` reads off its Chrome trace.

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

# H100 SXM, dense bf16 (NVIDIA's datasheet), as docs/performance.md's MFU figures.
BF16_PEAK_TFLOPS = 989.4


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


def tests_table(log):
    rows = []
    for line in open(log):
        m = re.match(r"\s*\d+/\d+ Test +#\d+: (\S+) \.+\s*(\*\*\*)?(\w+)\s+([\d.]+) sec", line)
        if m:
            rows.append((m.group(1), m.group(3), float(m.group(4))))
    passed = sum(1 for _, state, _ in rows if state == "Passed")
    out = [f"{passed} of {len(rows)} passed (`ctest -L gpu`, 3 at a time, `scripts/gpu/one_call.sh`):", "",
           "| test | result | seconds |", "|---|---|---|"]
    out += [f"| {name} | {state.lower()} | {sec:.1f} |" for name, state, sec in rows]
    return out


def spread_table(runs_dir):
    rows = []
    for name in sorted(os.listdir(runs_dir)):
        if name.endswith(".json"):
            r = json.load(open(os.path.join(runs_dir, name)))
            rows.append((name[:-5], r))
    out = ["| run | cuda_graph | ours ms/step | PyTorch eager ms/step (same run) | ours / eager |", "|---|---|---|---|---|"]
    for name, r in rows:
        out.append(f"| {name} | {str(r['cuda_graph']).lower()} | {r['ours_ms']:.2f} | {r['pytorch_ms']:.2f} | "
                   f"{r['ours_ms'] / r['pytorch_ms']:.3f} |")
    out.append("")
    for graphed in (False, True):
        ours = [r["ours_ms"] for _, r in rows if r["cuda_graph"] == graphed]
        ref = [r["pytorch_ms"] for _, r in rows if r["cuda_graph"] == graphed]
        if not ours:
            continue
        out.append(f"- {'graphed' if graphed else 'eager'}: ours {min(ours):.1f} to {max(ours):.1f} ms (median "
                   f"{statistics.median(ours):.1f}, spread {(max(ours) - min(ours)) / statistics.median(ours):.0%}); "
                   f"PyTorch eager in the same runs {min(ref):.1f} to {max(ref):.1f} ms (median "
                   f"{statistics.median(ref):.1f}, spread {(max(ref) - min(ref)) / statistics.median(ref):.0%}).")
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


def page(folder):
    facts = open(os.path.join(folder, "facts.txt")).read()
    date = re.search(r"^date:\s+(\S+)", facts, re.M).group(1)
    _, gpu, driver = [part.strip() for part in re.search(r"^gpus:\s+(.+)$", facts, re.M).group(1).split(",")[:3]]
    torch_version, cuda = re.search(r"^torch:\s+(\S+), built for CUDA ([\d.]+)", facts, re.M).groups()
    eager = profile_totals(os.path.join(folder, "profile_bf16_eager.txt"))
    graphed = profile_totals(os.path.join(folder, "profile_bf16_graphed.txt"))
    trace = json.load(open(os.path.join(folder, "graphed_trace_steps.json")))
    steps = [json.loads(line) for line in open(os.path.join(folder, "graphed_steps.jsonl"))]
    runs = [json.load(open(os.path.join(folder, "runs", n))) for n in os.listdir(os.path.join(folder, "runs"))
            if n.endswith(".json")]
    params = runs[0]["non_embedding_params"]
    flops = step_flops(params, 64, 128)
    full = [s for s in trace["steps"] if s["events"] > 500]
    span = statistics.median(s["span_ms"] for s in full)
    unwaited = [s for s in steps if s["wait_ms"] < 1.0]

    def listed(values):
        return ", ".join(f"{v:.1f}" for v in values)

    out = [f"Measured on {date[:10]} on a lent {gpu} (driver {driver}, CUDA {cuda}, torch {torch_version}) by",
           "`scripts/gpu/one_call.sh` and one graphed run of",
           "`scripts/bench/train_step_vs_pytorch.sh --device cuda --preset base --seq 128 --batch 64 --steps 40 "
           "--threads 4 --precision bf16 --cuda-graph --profile DIR`;",
           f"the files are in `{folder}`, and this section is `scripts/gpu/facts_page.py page {folder}`.", "",
           "### Tests on the GPU", ""] + tests_table(os.path.join(folder, "ctest-gpu.txt"))
    out += ["", "### Where the bf16 step's time goes (bert-base, seq 128, batch 64)", "",
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
    out += ["", "### Run to run", ""] + spread_table(os.path.join(folder, "runs"))
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
