#!/usr/bin/env python3
"""Bad input: exit code 2, one clear line naming the file, line and key, and no runs/
output, for malformed YAML, an unknown key, a wrong type, negative epochs, a missing
dataset file, a truncated checkpoint and a safetensors file whose header lies."""
import argparse
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

from e2e_common import job_yaml, run_worker, subset_tsv, write


def lying_hf_folder(folder):
    os.makedirs(folder, exist_ok=True)
    write(os.path.join(folder, "config.json"), json.dumps({
        "vocab_size": 8000, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 512, "max_position_embeddings": 64, "hidden_act": "gelu"}))
    header = json.dumps({"bert.embeddings.word_embeddings.weight":
                         {"dtype": "F32", "shape": [8000, 128], "data_offsets": [0, 1024]}}).encode()
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 1024)


def truncated_checkpoint(worker, work, train):
    job = write(os.path.join(work, "ckpt_job.yaml"),
                job_yaml("ckpt_job", train, "train:\n  max_steps: 3\ncheckpoint:\n  every_steps: 3\n"))
    result = run_worker(worker, job, os.path.join(work, "ckpt_runs"))
    assert result.returncode == 0, result.stderr
    path = sorted(glob.glob(os.path.join(work, "ckpt_runs", "ckpt_job", "checkpoints", "*.safetensors")))[-1]
    broken = os.path.join(work, "broken.safetensors")
    shutil.copy(path, broken)
    os.truncate(broken, os.path.getsize(broken) // 2)
    return broken


def cases(work, train, broken_checkpoint):
    good = job_yaml("bad", train)
    lying = os.path.join(work, "lying_model")
    lying_hf_folder(lying)
    return {
        "malformed YAML": (good.replace("model:\n", "model: [\n"), r"malformed YAML"),
        "unknown key": (good.replace("  preset: tiny", "  presett: tiny"), r"model\.presett: unknown key; did you mean 'preset'"),
        "wrong type": (good + "train:\n  batch_size: many\n", r"train\.batch_size: expected an integer, got 'many'"),
        "negative epochs": (good + "train:\n  epochs: -2\n", r"train\.epochs: expected an integer >= 1, got -2"),
        "missing dataset": (good.replace(train, os.path.join(work, "nope.tsv")), r"data\.train: file not found"),
        "truncated checkpoint": (good + f"checkpoint:\n  resume: {broken_checkpoint}\n",
                                 r"checkpoint\.resume: .*broken\.safetensors: invalid safetensors: .*truncated"),
        "lying safetensors": (good.replace("  preset: tiny", f"  init: {lying}"),
                              r"model\.init: .*model\.safetensors: invalid safetensors: .*needs 4096000 bytes but data_offsets span 1024"),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        train = subset_tsv(work, 200)
        broken = truncated_checkpoint(args.worker, work, train)
        for name, (yaml_text, expected) in cases(work, train, broken).items():
            job = write(os.path.join(work, "case", "job.yaml"), yaml_text)
            runs = os.path.join(work, "case_runs")
            result = run_worker(args.worker, job, runs)
            lines = [l for l in result.stderr.splitlines() if l.strip()]
            located = bool(lines) and re.match(r"error: .*job\.yaml:\d+:\d+: ", lines[0])
            ok = (result.returncode == 2 and len(lines) == 1 and located and re.search(expected, lines[0])
                  and not os.path.exists(runs))
            print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {result.returncode}: {' | '.join(lines)}")
            failures += not ok
            shutil.rmtree(runs, ignore_errors=True)
    pool = subprocess.run([args.worker, "--coordinator", "127.0.0.1:5555"], capture_output=True, text=True, timeout=60)
    ok = pool.returncode == 2 and "not a usable ZeroMQ endpoint" in pool.stderr
    print(f"{'ok  ' if ok else 'FAIL'} malformed --coordinator: exit {pool.returncode}: {pool.stderr.strip()}")
    failures += not ok
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
