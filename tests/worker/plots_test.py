#!/usr/bin/env python3
"""The SVG plots, rendered by a real SVG renderer (rsvg-convert) and checked as images.

A small benchmark sweep (fp32 and bf16, eager and int8) writes throughput.svg and
latency_heatmap.svg; a 2-epoch fine-tune evaluated every 5 steps writes curves.svg, whose
loss and dev metric panels draw every logged step and evaluation. Each file must parse as XML,
render to a PNG without error, and in the PNG every series' legend colour must be drawn
(so no line is hidden under another of the same colour). In the SVG: one throughput panel
per precision and mode, no colour repeated within a panel, both axes labelled with ticks,
and the throughput axis logarithmic where the lines span more than a decade. The PNGs
are kept in --artifacts for a person to look at."""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import LANGID, job_yaml, subset_tsv, write  # noqa: E402

SWATCH = re.compile(r"stroke='(#[0-9a-f]{6})' stroke-width='3'")


def panels_of(svg_text):
    """[(title, [legend colours])] in document order."""
    panels = []
    for line in svg_text.splitlines():
        if "font-weight='bold'" in line:
            panels.append((re.sub(r"<[^>]+>", "", line), []))
        elif panels and SWATCH.search(line):
            panels[-1][1].append(SWATCH.search(line).group(1))
    return panels


def render(svg, artifacts):
    png = os.path.join(artifacts, os.path.basename(os.path.dirname(svg)) + "_" +
                       os.path.basename(svg).replace(".svg", ".png"))
    subprocess.run(["rsvg-convert", "-o", png, svg], check=True, capture_output=True)
    image = Image.open(png).convert("RGB")
    check(image.width > 300 and image.height > 200, image.size)
    return image


def colours_drawn(image):
    return {"#%02x%02x%02x" % rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}


def check_chart(svg, artifacts, want_panels=None):
    text = open(svg).read()
    ET.fromstring(text)  # well-formed XML
    image = render(svg, artifacts)
    panels = panels_of(text)
    drawn = colours_drawn(image)
    for title, colours in panels:
        check(len(set(colours)) == len(colours), f"{svg}: a colour repeats in panel '{title}': {colours}")
        missing = [c for c in colours if c not in drawn]
        check(not missing, f"{svg}: panel '{title}' colours {missing} not in the rendered image")
    if want_panels is not None:
        titles = [t for t, _ in panels]
        check(titles == want_panels, titles)
    print(f"{os.path.basename(svg)}: {len(panels)} panels, {image.width}x{image.height} PNG, "
          f"{sum(len(c) for _, c in panels)} series all drawn in distinct colours")
    return text


def benchmark(worker, work, artifacts):
    job = write(os.path.join(work, "plots_bench.yaml"), f"""name: plots_bench
kind: benchmark
data:
  train: {LANGID}/train.tsv
  labels: {LANGID}/labels.txt
  tokenizer: {{vocab: {LANGID}/vocab.txt}}
model: {{preset: tiny}}
runtime: {{device: cpu, threads: 1}}
benchmark:
  batch_sizes: [1, 2, 8]
  seq_lens: [8, 32, 256]
  precisions: [fp32, bf16]
  modes: [eager, int8]
  warmup: 1
  iters: 3
""")
    result = subprocess.run([worker, job, "--runs-dir", os.path.join(work, "runs")], capture_output=True, text=True)
    check(result.returncode == 0, result.stderr[-3000:])
    out = os.path.join(work, "runs", "plots_bench")
    # bf16 int8 cells are N/A (int8 takes fp32 activations), so that panel has no data and is left out
    want = ["throughput, bf16 / eager", "throughput, fp32 / eager", "throughput, fp32 / int8"]
    text = check_chart(os.path.join(out, "throughput.svg"), artifacts, want)
    # seq 8 vs 256 spans decades
    check("batch size (log scale)" in text and "sequences / s (log scale)" in text,
          "both throughput axes are log scale")
    for tick in (">1<", ">2<", ">8<"):
        check(tick in text, tick)
    heatmap = check_chart(os.path.join(out, "latency_heatmap.svg"), artifacts)
    check(heatmap.count("log scale</text>") == 3, "every heatmap panel with measured cells has its colour key")


def points_in_panel(svg_text, title):
    """How many points (circles) the panel titled `title` draws."""
    begin = svg_text.index(f"font-weight='bold'>{title}<")
    end = svg_text.find("font-weight='bold'", begin + 1)
    return svg_text[begin:end if end >= 0 else len(svg_text)].count("<circle")


def curves(worker, work, artifacts):
    extra = ("train: {epochs: 2, batch_size: 16, lr: 1.0e-3}\n"
             "eval: {every_steps: 5, metrics: [accuracy, f1]}\n")
    job = write(os.path.join(work, "plots_curves.yaml"), job_yaml("plots_curves", subset_tsv(work, 320), extra))
    result = subprocess.run([worker, job, "--runs-dir", os.path.join(work, "runs")], capture_output=True, text=True)
    check(result.returncode == 0, result.stderr[-3000:])
    svg = os.path.join(work, "runs", "plots_curves", "curves.svg")
    text = check_chart(svg, artifacts, ["loss", "dev metrics", "learning rate",
                                        "time per step (median across ranks)", "throughput"])
    for label in ("optimizer step", "epoch", "value", "ms / step", "samples / s"):
        check(label in text, label)
    for tick in (">1<", ">2<"):
        check(tick in text, tick)
    # 40 steps, each logged (job_yaml's steps_every: 1), and 8 evaluations: 40 train and 8
    # dev losses, accuracy and F1 at each evaluation
    check(points_in_panel(text, "loss") == 40 + 8, points_in_panel(text, "loss"))
    check(points_in_panel(text, "dev metrics") == 2 * 8, points_in_panel(text, "dev metrics"))
    check(points_in_panel(text, "learning rate") == 40, points_in_panel(text, "learning rate"))


def test(a, work):
    os.makedirs(a.artifacts, exist_ok=True)
    benchmark(a.worker, work, a.artifacts)
    curves(a.worker, work, a.artifacts)
    print(f"PNGs in {a.artifacts}")


def options(p):
    p.add_argument("--artifacts", required=True, help="folder the rendered PNGs are kept in")


if __name__ == "__main__":
    run_test(test, description=__doc__, options=options)
