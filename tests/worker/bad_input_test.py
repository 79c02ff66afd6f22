#!/usr/bin/env python3
"""Bad input: exit code 2, one clear line naming the file, line and key, no runs/ output
and nothing else written beside it, for malformed and unusual YAML, unknown keys, wrong
types, integers out of their field's range, NaN, unsafe job names, datasets that are
not regular files (FIFO, /dev/zero, a folder), config.json sizes that are zero,
negative, huge or inconsistent, and checkpoints or safetensors files that are truncated,
bit-flipped, carry bad metadata or lie in their header. Each case ends within a
timeout (a FIFO used to block every rank)."""
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import (LANGID as LANGID_DIR, dev_subset, flip_bits, job_yaml, run_worker, set_metadata,  # noqa: E402
                         subset_tsv, write)


HF_CONFIG = {"vocab_size": 8000, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 512, "max_position_embeddings": 64, "hidden_act": "gelu"}


def hf_folder(folder, **config_changes):
    """An HF folder whose config.json has `config_changes`; its weights are never reached."""
    os.makedirs(folder, exist_ok=True)
    write(os.path.join(folder, "config.json"), json.dumps(dict(HF_CONFIG, **config_changes)))
    write(os.path.join(folder, "model.safetensors"), "unused")
    return folder


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
    check(result.returncode == 0, result.stderr)
    path = sorted(glob.glob(os.path.join(work, "ckpt_runs", "ckpt_job", "checkpoints", "*.safetensors")))[-1]
    broken = os.path.join(work, "broken.safetensors")
    shutil.copy(path, broken)
    os.truncate(broken, os.path.getsize(broken) // 2)
    flipped = os.path.join(work, "flipped.safetensors")
    shutil.copy(path, flipped)
    flip_bits(flipped, 2000)
    bad_meta = os.path.join(work, "bad_meta.safetensors")
    shutil.copy(path, bad_meta)
    set_metadata(bad_meta, global_step="3abc")
    return broken, flipped, bad_meta


def config_cases(work, good):
    """config.json sizes that gave SIGFPE (zero heads), torch stack traces or a 0-layer model."""
    bad = {
        "zero heads": ({"num_attention_heads": 0}, r"num_attention_heads': expected an integer in \[1, 16384\], got 0"),
        "-1 layers": ({"num_hidden_layers": -1}, r"num_hidden_layers': expected an integer in \[1, 256\], got -1"),
        "negative hidden": ({"hidden_size": -128}, r"hidden_size': expected an integer in \[1, 16384\], got -128"),
        "huge vocab": ({"vocab_size": 2 ** 62}, r"vocab_size': expected an integer in \[1, 1000000\]"),
        "heads not dividing hidden": ({"num_attention_heads": 3}, r"num_attention_heads': 3 does not divide hidden_size 128"),
        "fractional size": ({"intermediate_size": 512.5}, r"intermediate_size': expected an integer, got 512.5"),
        "dropout 1.5": ({"hidden_dropout_prob": 1.5}, r"hidden_dropout_prob': expected a number in \[0\.0+, 1\.0+\), got 1\.5"),
        "too many parameters": ({"hidden_size": 16384, "num_attention_heads": 16, "num_hidden_layers": 256,
                                 "intermediate_size": 65536}, r"hidden_size': the sizes make .* million parameters"),
        "bad id2label": ({"id2label": {"0": "a", "5": "b"}}, r"id2label': ids must be 0\.\.1, each once; got '5'"),
    }
    out = {}
    for i, (name, (changes, expected)) in enumerate(bad.items()):
        folder = hf_folder(os.path.join(work, f"config_{i}"), **changes)
        out[f"config.json {name}"] = (good.replace("  preset: tiny", f"  init: {folder}"),
                                      r"model\.init: .*config\.json: (field '|)" + expected)
    return out


def special_file_cases(work, train, good):
    fifo = os.path.join(work, "fifo.tsv")
    os.mkfifo(fifo)
    special = "a special file \\(FIFO, device or socket\\), not a regular file"
    return {
        "FIFO dataset": (good.replace(train, fifo), r"data\.train: " + special),
        "/dev/zero dataset": (good.replace(train, "/dev/zero"), r"data\.train: " + special),
        "folder as dev set": (good.replace(dev_subset(work), work),
                              r"data\.dev: a folder, not a regular file"),
    }


def cases(work, train, checkpoints):
    broken_checkpoint, flipped, bad_meta = checkpoints
    good = job_yaml("bad", train)
    lying = os.path.join(work, "lying_model")
    lying_hf_folder(lying)
    return {
        **config_cases(work, good),
        **special_file_cases(work, train, good),
        "huge epochs": (good + "train:\n  epochs: 4294967297\n",
                        r"train\.epochs: expected an integer in \[1, 100000\], got 4294967297"),
        "huge batch_size": (good + "train:\n  batch_size: 4294967297\n",
                            r"train\.batch_size: expected an integer in \[1, 65536\], got 4294967297"),
        "huge checkpoint.keep": (good + "checkpoint:\n  keep: 4294967296\n",
                                 r"checkpoint\.keep: expected an integer in \[1, 10000\], got 4294967296"),
        "CUDA graphs on a CPU": (good + "train:\n  cuda_graph: true\n",
                                 r"train\.cuda_graph: CUDA graphs need a CUDA device; this job runs on cpu"),
        "CUDA graphs of accumulated micro-batches": (
            good + "train:\n  cuda_graph: true\n  gradient_accumulation_steps: 2\n",
            r"train\.cuda_graph: a graphed step holds one batch, not train\.gradient_accumulation_steps micro-batches"),
        "NaN lr": (good + "train:\n  lr: .nan\n", r"train\.lr: expected a finite number, got '\.nan'"),
        "elastic without a coordinator": (good + "distributed:\n  elastic:\n    max_replicas: 2\n",
                                          r"distributed\.elastic\.max_replicas: elastic replicas agree on each step through a "
                                          r"coordinator: submit the job to one"),
        "name ..": (good.replace("name: bad", "name: .."), r"name: expected one path component"),
        "name with a newline": (good.replace("name: bad", 'name: "bad\\nname"'), r"name: expected one path component"),
        "complex key": ("? [a, b]\n: 1\n" + good, r"<document>: expected a plain key"),
        "alias of its own map as an integer": (good.replace("data:\n", "data: &d\n").replace("  max_seq_len: 64",
                                                                                             "  max_seq_len: *d"),
                                               r"data\.max_seq_len: expected an integer"),
        "bit-flipped checkpoint": (good + f"checkpoint:\n  resume: {flipped}\n",
                                   r"checkpoint\.resume: .*flipped\.safetensors: .*do not match their checksum"),
        "checkpoint with bad metadata": (good + f"checkpoint:\n  resume: {bad_meta}\n",
                                         r"checkpoint\.resume: .*bad_meta\.safetensors: checkpoint metadata "
                                         r"'global_step': expected an integer, got '3abc'"),
        "malformed YAML": (good.replace("model:\n", "model: [\n"), r"malformed YAML"),
        "unknown key": (good.replace("  preset: tiny", "  presett: tiny"), r"model\.presett: unknown key; did you mean 'preset'"),
        "wrong type": (good + "train:\n  batch_size: many\n", r"train\.batch_size: expected an integer, got 'many'"),
        "negative epochs": (good + "train:\n  epochs: -2\n", r"train\.epochs: expected an integer in \[1, 100000\], got -2"),
        "missing dataset": (good.replace(train, os.path.join(work, "nope.tsv")), r"data\.train: file not found"),
        "merges.txt missing": (good.replace(f"    vocab: {os.path.join(LANGID_DIR, 'vocab.txt')}\n",
                                            f"    kind: bpe\n    vocab: {os.path.join(LANGID_DIR, 'bpe', 'vocab.json')}\n"
                                            f"    merges: {os.path.join(work, 'bpe', 'merges.txt')}\n"),
                               r"data\.tokenizer\.merges: file not found: .*/bpe/merges\.txt"),
        "truncated checkpoint": (good + f"checkpoint:\n  resume: {broken_checkpoint}\n",
                                 r"checkpoint\.resume: .*broken\.safetensors: invalid safetensors: .*truncated"),
        "lying safetensors": (good.replace("  preset: tiny", f"  init: {lying}"),
                              r"model\.init: .*model\.safetensors: invalid safetensors: .*needs 4096000 bytes but data_offsets span 1024"),
    }


def run_folder_cases(worker, work, train):
    """Run folders are ours: a symlinked one, or a runs folder under a file, is exit 2 with
    nothing touched; a fresh run deletes only the checkpoints and event files it knows."""
    failures = 0
    job = write(os.path.join(work, "folders", "job.yaml"), job_yaml("mine", train, "train:\n  max_steps: 2\n"))
    elsewhere = os.path.join(work, "folders", "elsewhere")
    os.makedirs(os.path.join(elsewhere, "checkpoints"))
    write(os.path.join(elsewhere, "checkpoints", "step-00000001.safetensors"), "someone else's")
    os.makedirs(os.path.join(work, "folders", "runs"))
    os.symlink(elsewhere, os.path.join(work, "folders", "runs", "mine"))
    write(os.path.join(work, "folders", "a_file"), "x")
    runs_of = {"symlinked run folder": os.path.join(work, "folders", "runs"),
               "runs folder under a file": os.path.join(work, "folders", "a_file", "runs")}
    for name, expected in (("symlinked run folder", r"runs/mine is a symbolic link"),
                           ("runs folder under a file", r"a_file is a file, so the run folder")):
        result = run_worker(worker, job, runs_of[name], timeout=120)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        ok = (result.returncode == 2 and len(lines) == 1 and re.search(expected, lines[0])
              and sorted(os.listdir(elsewhere)) == ["checkpoints"]
              and os.listdir(os.path.join(elsewhere, "checkpoints")) == ["step-00000001.safetensors"])
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {result.returncode}: {' | '.join(lines)}")
        failures += not ok
    runs = os.path.join(work, "folders", "fresh_runs")
    for folder, name in (("checkpoints", "step-00000009.safetensors"), ("checkpoints", "notes.txt"),
                         ("tb", "events.out.tfevents.1.old.1"), ("tb", "README")):
        write(os.path.join(runs, "mine", folder, name), "older")
    result = run_worker(worker, job, runs, timeout=300)
    left = {f: sorted(os.listdir(os.path.join(runs, "mine", f))) for f in ("checkpoints", "tb")}
    ok = (result.returncode == 0 and "notes.txt" in left["checkpoints"] and "README" in left["tb"]
          and "step-00000009.safetensors" not in left["checkpoints"] and "events.out.tfevents.1.old.1" not in left["tb"])
    print(f"{'ok  ' if ok else 'FAIL'} a fresh run deletes only its own kind of files: exit {result.returncode}, {left}")
    return failures + (not ok)


def override_cases(worker, work, train):
    """Values from the command line (--set) and the environment (${VAR}): a bad one is exit
    2, one line naming the flag (or the file's line) and the key, and nothing written."""
    job = write(os.path.join(work, "override", "job.yaml"),
                job_yaml("bad", train).replace("  max_seq_len: 64", "  max_seq_len: ${TY_BAD_INPUT_UNSET}"))
    env = {k: v for k, v in os.environ.items() if k != "TY_BAD_INPUT_UNSET"}
    good = write(os.path.join(work, "override", "good.yaml"), job_yaml("bad", train))
    runs = os.path.join(work, "override", "runs")
    failures = 0
    for name, path, extra, expected in [
            ("--set of a bad value", good, ["--set", "train.lr=abc"],
             r"^error: --set train\.lr=abc: train\.lr: expected a number, got 'abc'$"),
            ("--set of an unknown key", good, ["--set", "train.lrr=1"],
             r"^error: --set train\.lrr=1: train\.lrr: unknown key; did you mean 'lr'\?$"),
            ("--set without a value", good, ["--set", "train.lr"],
             r"^error: --set train\.lr: expected KEY\.PATH=VALUE, e\.g\. train\.lr=3e-5$"),
            ("--max-steps out of range", good, ["--max-steps", "2000000000000"],
             r"^error: --max-steps 2000000000000: train\.max_steps: expected an integer in \[0, 1000000000000\]"),
            ("an unset ${VAR}", job, [],
             r"^error: .*job\.yaml:\d+:\d+: data\.max_seq_len: \$\{TY_BAD_INPUT_UNSET\} is not set in the "
             r"environment \(\$\{TY_BAD_INPUT_UNSET:-default\} gives a default\)$")]:
        result = run_worker(worker, path, runs, *extra, timeout=120, env=env)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        ok = result.returncode == 2 and len(lines) == 1 and re.search(expected, lines[0]) and not os.path.exists(runs)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {result.returncode}: {' | '.join(lines)}")
        failures += not ok
    return failures


def test(args, work):
    failures = 0
    train = subset_tsv(work, 200)
    checkpoints = truncated_checkpoint(args.worker, work, train)
    for name, (yaml_text, expected) in cases(work, train, checkpoints).items():
        job = write(os.path.join(work, "case", "runs_parent", "job.yaml"), yaml_text)
        runs = os.path.join(work, "case", "runs_parent", "runs")
        beside = sorted(os.listdir(os.path.dirname(runs)))
        try:
            result = run_worker(args.worker, job, runs, timeout=120)
        except subprocess.TimeoutExpired:
            print(f"FAIL {name}: still running after 120 s")
            failures += 1
            continue
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        located = bool(lines) and re.match(r"error: .*job\.yaml:\d+:\d+: ", lines[0])
        # `name: ..` wrote into the parent of runs/: nothing may appear beside it either.
        ok = (result.returncode == 2 and len(lines) == 1 and located and re.search(expected, lines[0])
              and not os.path.exists(runs) and sorted(os.listdir(os.path.dirname(runs))) == beside)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {result.returncode}: {' | '.join(lines)}")
        failures += not ok
        shutil.rmtree(os.path.join(work, "case"), ignore_errors=True)
    failures += run_folder_cases(args.worker, work, train)
    failures += override_cases(args.worker, work, train)
    pool = subprocess.run([args.worker, "--coordinator", "127.0.0.1:5555"], capture_output=True, text=True, timeout=60)
    ok = pool.returncode == 2 and "not a usable ZeroMQ endpoint" in pool.stderr
    print(f"{'ok  ' if ok else 'FAIL'} malformed --coordinator: exit {pool.returncode}: {pool.stderr.strip()}")
    failures += not ok
    pool = subprocess.run([args.worker, "--coordinator", "tcp://127.0.0.1:5555", "--insecure", "--mpirun",
                           os.path.join(work, "no-such-mpirun")], capture_output=True, text=True, timeout=60)
    ok = pool.returncode == 2 and "--mpirun" in pool.stderr and "no such executable" in pool.stderr
    print(f"{'ok  ' if ok else 'FAIL'} missing --mpirun: exit {pool.returncode}: {pool.stderr.strip()}")
    failures += not ok
    check(not failures, f"{failures} bad inputs were not refused as they should be (the FAIL lines above)")


if __name__ == "__main__":
    run_test(test, description=__doc__)
