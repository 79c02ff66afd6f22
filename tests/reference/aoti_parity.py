#!/usr/bin/env python3
"""AOTInductor packages (`aoti` mode), made by scripts/export_aoti.py from an HF folder
and run from C++ through libtorch's AOTIModelPackageLoader:

  - the package's logits and our eager model's equal HF's eager logits to within the
    rounding HF's own fp32 forward makes against the same model in float64
    (tests/harness/bounds.py), at two batch sizes and lengths (one padded row), so the
    dynamic dimensions work;
  - an inference job in `mode: aoti` predicts what the eager job predicts;
  - a benchmark job times an aoti cell, and a cell longer than the package allows is N/A;
  - refused with exit 2 and the reason: a file that is not a package, a package whose
    metadata names another torch version, one compiled for vector instructions the CPU
    lacks (ATEN_CPU_CAPABILITY=default makes ATen see a CPU without AVX), and a job whose
    batches do not fit the package.
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile

import torch
from random_bert import save_random_bert

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import SOURCE_DIR, check, run_test  # noqa: E402
from harness.bounds import in_float64, within_rounding_of  # noqa: E402
from harness.e2e import LANGID  # noqa: E402


def make_model(work):
    vocab = sum(1 for _ in open(os.path.join(LANGID, "vocab.txt"), encoding="utf-8"))
    hf_dir = os.path.join(work, "hf")
    model = save_random_bert(hf_dir, vocab, 64, 4, 128, 0.15)
    shutil.copy(os.path.join(LANGID, "vocab.txt"), hf_dir)
    return model, hf_dir, vocab


def retag(package, out, key, value):
    """A copy of the package with one metadata value changed."""
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(out, "w") as dst:
        changed = False
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("metadata.json") and key.encode() in data:
                meta = json.loads(data)
                meta[key] = value
                data = json.dumps(meta).encode()
                changed = True
            dst.writestr(item, data)
    return changed


def test(args, work):
    checks = {}
    model, hf_dir, vocab = make_model(work)
    package = os.path.join(work, "bert.pt2")
    # Inductor probes each vector ISA the CPU lists by building a test program and loading
    # it in a fresh Python that imports torch (seconds each); TORCHINDUCTOR_VEC_ISA_OK
    # takes the CPU's own flags instead, which is what the package is compiled for either way.
    export = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "scripts", "export_aoti.py"), "--model",
                             hf_dir, "--out", package, "--max-batch", "16", "--max-seq", "64"],
                            capture_output=True, text=True, env=dict(os.environ, TORCHINDUCTOR_VEC_ISA_OK="1"))
    print(export.stdout.strip() or export.stderr[-3000:])
    check(export.returncode == 0, "scripts/export_aoti.py failed (its output is above)")

    for batch, seq in ((3, 24), (8, 64)):
        ids = torch.randint(5, vocab, (batch, seq))
        mask = torch.ones_like(ids)
        ids[1, seq // 2:] = 0
        mask[1, seq // 2:] = 0
        inputs = os.path.join(work, f"inputs_{batch}.json")
        json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, open(inputs, "w"))
        with torch.no_grad():
            expected = model(ids, attention_mask=mask).logits
            exact = in_float64(model)(ids, attention_mask=mask).logits

        def probe(*cmd):
            out = subprocess.run([args.probe, *cmd], capture_output=True, text=True, check=True).stdout
            return torch.tensor(json.loads(out)["logits"])

        aoti, eager = probe("aoti", package, inputs), probe("logits", hf_dir, inputs)
        close = True
        for name, candidate in (("aoti", aoti), ("our eager", eager)):
            ok, detail = within_rounding_of(candidate, expected, exact)
            print(f"{batch} x {seq}: {name}: {detail}; max |logit diff| from HF "
                  f"{(candidate - expected).abs().max().item():.2e}")
            close &= ok
        checks[f"{batch} x {seq}: aoti logits and ours equal HF's within its fp32 rounding"] = close

    runs = os.path.join(work, "runs")
    dev = os.path.join(work, "dev.tsv")
    with open(os.path.join(LANGID, "dev.tsv"), encoding="utf-8") as f:
        open(dev, "w", encoding="utf-8").writelines(f.readlines()[:101])

    def job(name, body, env=None):
        path = os.path.join(work, name + ".yaml")
        with open(path, "w") as f:
            f.write(f"name: {name}\n{body}data:\n  train: {dev}\n  max_seq_len: 64\n"
                    f"  tokenizer: {{vocab: {LANGID}/vocab.txt}}\nmodel: {{init: {hf_dir}}}\n"
                    "runtime: {device: cpu, threads: 1}\nlog: {progress: false}\n")
        return subprocess.run([args.worker, path, "--runs-dir", runs], capture_output=True, text=True,
                              env=dict(os.environ, **(env or {})))

    def predictions(name):
        with open(os.path.join(runs, name, "predictions.tsv"), encoding="utf-8") as f:
            return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))

    def inference(mode, extra="", batch=16):
        return f"kind: inference\ninference: {{input: {dev}, batch_size: {batch}, mode: {mode}{extra}}}\n"

    eager_run = job("eager", inference("eager"))
    aoti_run = job("aoti", inference("aoti", f", aoti: {package}"))
    print(aoti_run.stderr[-600:])
    same = eager_run.returncode == 0 and aoti_run.returncode == 0 and all(
        a["predicted"] == b["predicted"] and
        max(abs(float(a[k]) - float(b[k])) for k in a if k.startswith("logit_")) < 1e-4
        for a, b in zip(predictions("eager"), predictions("aoti")))
    checks["an aoti inference job predicts what the eager one does"] = same

    bench = job("bench", f"kind: benchmark\nbenchmark: {{batch_sizes: [2], seq_lens: [16, 128], precisions: "
                         f"[fp32], modes: [eager, aoti], aoti: {package}, warmup: 1, iters: 3}}\n")
    cells = {}
    if bench.returncode == 0:
        with open(os.path.join(runs, "bench", "benchmark.csv"), encoding="utf-8") as f:
            cells = {(c["mode"], c["seq_len"]): c["status"] for c in csv.DictReader(f)}
    print("benchmark cells:", cells)
    checks["a benchmark times aoti cells; one beyond the package is N/A"] = (
        cells.get(("aoti", "16")) == "ok" and cells.get(("aoti", "128")) == "N/A")

    def refused(name, path, expect, env=None, batch=16):
        run = job(name, inference("aoti", f", aoti: {path}", batch), env)
        message = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        print(f"{name}: exit {run.returncode}: {message}")
        return run.returncode == 2 and expect in message and "inference." in message

    garbage = os.path.join(work, "garbage.pt2")
    open(garbage, "wb").write(b"not a zip file at all")
    checks["a file that is not a package is refused"] = refused("garbage", garbage, "not an AOTInductor package")
    other = os.path.join(work, "other_torch.pt2")
    retagged = retag(package, other, "trainyard_torch_version", "2.0.0")
    checks["a package from another torch version is refused"] = retagged and refused(
        "other_torch", other, "compiled by torch 2.0.0")
    # A run whose ATen is already held to its baseline (ATEN_CPU_CAPABILITY=default, a
    # CI pass) exported a package without vector instructions: none is lacking.
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "default":
        print("SKIP a package for vector instructions the CPU lacks is refused (ATen is at its baseline "
              "here: the package has no vector instructions to lack; the native run checks it)")
    else:
        checks["a package for vector instructions the CPU lacks is refused"] = refused(
            "no_avx", package, "compiled for", env={"ATEN_CPU_CAPABILITY": "default"})
    checks["batches larger than the package allows are refused"] = refused("too_big", package, "do not fit",
                                                                            batch=64)
    for name, ok in checks.items():
        print(("PASS " if ok else "FAIL ") + name)
    check(all(checks.values()), f"failed: {[name for name, ok in checks.items() if not ok]}")


if __name__ == "__main__":
    run_test(test, ("--probe", "--worker"), __doc__)
