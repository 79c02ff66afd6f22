"""Helpers for the end-to-end worker tests: small real jobs on the prepared langid data."""
import json
import os
import socket
import struct
import subprocess
import sys
import time

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LANGID = os.path.join(SOURCE_DIR, "data", "prepared", "langid")
# The environment mpirun needs here: containers run as root, and tests oversubscribe the cores.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def run_case(cases, description=None):
    """The main of a test file of named cases: `--worker`, `--mpirun` and a case name;
    the case gets the arguments and a temporary folder and returns whether it passed."""
    import argparse
    import tempfile
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("case", choices=sorted(cases))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ok = cases[args.case](args, work)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subset_tsv(folder, count, split="train"):
    """The first `count` examples of langid's `split`, as a TSV in `folder`."""
    path = os.path.join(folder, f"{split}_{count}.tsv")
    with open(os.path.join(LANGID, f"{split}.tsv"), encoding="utf-8") as f:
        lines = f.readlines()[: count + 1]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return path


# Evaluation in a test's job: the first 750 of langid's 2,250 dev examples, which hold
# every language. A test that asserts an accuracy floor or compares with a reference on
# the whole set passes dev=FULL_DEV.
FULL_DEV = os.path.join(LANGID, "dev.tsv")
DEV_EXAMPLES = 750


def dev_subset(folder, count=DEV_EXAMPLES):
    """The first `count` dev examples of langid, as a TSV in `folder`. Written whole under a
    temporary name and renamed, as tests running at once may write the same file."""
    path = os.path.join(folder, f"dev_{count}.tsv")
    with open(FULL_DEV, encoding="utf-8") as f:
        lines = f.readlines()[: count + 1]
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(partial, path)
    return path


def job_yaml(name, train, extra="", device="cpu", dev=None):
    """A tiny-BERT langid job training on `train`, evaluated on `dev` (by default
    dev_subset() beside `train`)."""
    dev = dev or dev_subset(os.path.dirname(os.path.abspath(train)))
    return f"""name: {name}
seed: 7
data:
  train: {train}
  dev: {dev}
  labels: {os.path.join(LANGID, "labels.txt")}
  max_seq_len: 64
  loader_threads: 1
  tokenizer:
    vocab: {os.path.join(LANGID, "vocab.txt")}
model:
  preset: tiny
  dropout: 0.1
runtime:
  device: {device}
  threads: 1
log:
  progress: false
  steps_every: 1
{extra}"""


def steps(run_dir):
    """A run's steps.jsonl, one dict a line."""
    with open(os.path.join(run_dir, "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def weights(run_dir):
    """A run's final weights (model/model.safetensors), by name."""
    from safetensors.torch import load_file
    return load_file(os.path.join(run_dir, "model", "model.safetensors"))


def wait_for(predicate, timeout, what):
    """predicate()'s first true value, polled every 0.25 s; AssertionError after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def run_worker(worker, job, runs, *extra, **kwargs):
    return subprocess.run([worker, job, "--runs-dir", runs, *extra], capture_output=True, text=True, **kwargs)


def rank_pids(mpirun_pid, count, deadline):
    """The worker processes of an mpirun, by MPI rank (from their environment)."""
    while time.time() < deadline:
        found = {}
        out = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout.split()
        for pid in out:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                found[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
            except (OSError, KeyError, ValueError):
                pass
        if len(found) == count:
            return found
        time.sleep(0.1)
    sys.exit("could not find the worker ranks")


def read_safetensors_header(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + size]), blob[8 + size:]


def write_safetensors_header(path, header, data):
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def flip_bits(path, count=2000):
    """Flips `count` bits spread over a safetensors file's tensor data, header untouched."""
    header, data = read_safetensors_header(path)
    data = bytearray(data)
    for i in range(count):
        at = (i * 7919 + 13) % len(data)
        data[at] ^= 1 << (i % 8)
    write_safetensors_header(path, header, bytes(data))


def set_metadata(path, **changes):
    """Rewrites a safetensors file's metadata (a value None removes the key); the data stay."""
    header, data = read_safetensors_header(path)
    for key, value in changes.items():
        if value is None:
            header["__metadata__"].pop(key, None)
        else:
            header["__metadata__"][key] = value
    write_safetensors_header(path, header, data)


# ctest's SKIP_RETURN_CODE for the tests labelled gpu.
SKIPPED = 77


def require_cuda():
    """Exits with SKIPPED, saying why, on a machine without a usable CUDA device."""
    import torch
    if not torch.cuda.is_available():
        print("skipped: no CUDA device is visible to torch on this machine")
        sys.exit(SKIPPED)
    print(f"CUDA device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
