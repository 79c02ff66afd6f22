"""End-to-end pieces: small real jobs on the prepared langid data (job files, data subsets),
the worker's runs (steps, weights, a digest of every file), safetensors files edited in
place, free ports, polling, MPI ranks found by their environment, and stopping a process
group."""
import fcntl
import hashlib
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import threading
import time

from harness import SOURCE_DIR, skip

LANGID = os.path.join(SOURCE_DIR, "data", "prepared", "langid")
# The environment mpirun needs here: containers run as root, and tests oversubscribe the cores.
# Every standalone `mpirun` a test starts is started with SIGPIPE ignored
# (subprocess's restore_signals=False keeps Python's SIG_IGN), as the pool agent starts a
# job's: Open MPI 4.1's mpirun can die of a late SIGPIPE at its own shutdown, after the job
# finished (Note [Job isolation] in worker/pool/job_process.h). Its ranks get the default back.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
# Evaluation in a test's job: the first 750 of langid's 2,250 dev examples, which hold
# every language. A test that asserts an accuracy floor or compares with a reference on
# the whole set passes dev=FULL_DEV.
FULL_DEV = os.path.join(LANGID, "dev.tsv")
DEV_EXAMPLES = 750


# --- files and jobs ----------------------------------------------------------------------
def write(path, text):
    """Writes `text` to `path`, making its folder; returns the path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def subset_tsv(folder, count, split="train"):
    """The first `count` examples of langid's `split`, as a TSV in `folder`."""
    path = os.path.join(folder, f"{split}_{count}.tsv")
    with open(os.path.join(LANGID, f"{split}.tsv"), encoding="utf-8") as f:
        lines = f.readlines()[: count + 1]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return path


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


def run_worker(worker, job, runs, *extra, **kwargs):
    """`worker job --runs-dir runs ...`, its output captured as text."""
    return subprocess.run([worker, job, "--runs-dir", runs, *extra], capture_output=True, text=True, **kwargs)


def steps(run_dir):
    """A run's steps.jsonl, one dict a line."""
    with open(os.path.join(run_dir, "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def weights(run_dir):
    """A run's final weights (model/model.safetensors), by name."""
    from safetensors.torch import load_file
    return load_file(os.path.join(run_dir, "model", "model.safetensors"))


def tree_digest(folder, skip=()):
    """One hash of every file under `folder` (names and bytes), but for the names in `skip`:
    equal digests mean no file was added, removed or changed."""
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(set(files) - set(skip)):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest.update(path.encode() + f.read())
    return digest.hexdigest()


def require_cuda():
    """Skips the test, saying why, on a machine without a usable CUDA device."""
    import torch
    if not torch.cuda.is_available():
        skip("no CUDA device is visible to torch on this machine")
    print(f"CUDA device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")


# --- safetensors files -------------------------------------------------------------------
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


# --- ports, polling, processes ---------------------------------------------------------
# A port a test hands to a listener it starts is drawn below the kernel's ephemeral range,
# where no outgoing connection is given a local port, and is reserved by an flock on a file
# named after it, held until the test's process exits. So no other test running at once,
# and no client's connection, can take it between the draw and the listener's bind: a port
# that bind(0) gave back is free only until somebody's next connect() or bind(0).
PORT_LOCKS = "/tmp/trainyard-test-ports"
_held_port_locks = []
_port_draws = random.SystemRandom()  # not the tests' seeded module-level stream


def _test_port_range():
    """The ports a test draws from: below the ephemeral range, or above it where that starts low."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(20000, low) if low > 21000 else range(high + 1, 65536)


def _reserve(port):
    """True and the port's lock held by this process, or False where another test holds it."""
    os.makedirs(PORT_LOCKS, exist_ok=True)
    fd = os.open(os.path.join(PORT_LOCKS, str(port)), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held_port_locks.append(fd)
    return True


def _bindable(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on and that is this test's until its
    process exits (see PORT_LOCKS)."""
    ports = _test_port_range()
    for _ in range(200):
        port = _port_draws.choice(ports)
        if _reserve(port):
            if _bindable(port):
                return port
            os.close(_held_port_locks.pop())
    raise AssertionError(f"no free port in {ports.start}..{ports.stop - 1} after 200 draws")


def wait_for(predicate, timeout, what, every=0.25):
    """predicate()'s first true value, polled every `every` s; AssertionError after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def world_rank(pid):
    """The MPI rank (OMPI_COMM_WORLD_RANK) in the environment of process `pid`. Raises
    OSError, KeyError or ValueError for a process gone, or one that is not a rank."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return int(env[b"OMPI_COMM_WORLD_RANK"])


def rank_pids(mpirun_pid, count, deadline):
    """The worker processes of an mpirun, by MPI rank (from their environment)."""
    while time.time() < deadline:
        found = {}
        out = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout.split()
        for pid in out:
            try:
                found[world_rank(pid)] = int(pid)
            except (OSError, KeyError, ValueError):
                pass
        if len(found) == count:
            return found
        time.sleep(0.1)
    raise AssertionError("could not find the worker ranks")


class TimedOutput:
    """A process's stdout (a text pipe) read line by line as it comes, each line with the
    time it was read; a thread drains the pipe, so the process never blocks on it."""

    def __init__(self, proc):
        self.lines = []  # (time.time() when read, line)
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append((time.time(), line.rstrip("\n")))

    def text(self, timeout=10):
        """All of it, once the pipe has closed (or after `timeout` seconds)."""
        self._thread.join(timeout)
        return "\n".join(line for _, line in self.lines)

    def first(self, needle, since):
        """Seconds from `since` to the first line holding `needle`; None if none came."""
        return next((at - since for at, line in self.lines if needle in line), None)


def hang_waits(lines):
    """The seconds each collective timeout report among `lines` says its rank waited
    ("... timed out after 6.0 s; ...")."""
    return [float(m.group(1)) for m in (re.search(r"timed out after ([0-9.]+) s", l) for l in lines) if m]


def terminate(process, timeout):
    """SIGTERM to `process`, and SIGKILL to its process group (it must lead one:
    start_new_session=True) when it has not ended within `timeout` s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def print_tails(paths, lines):
    """The last `lines` lines of each log in `paths`, for a failure's output."""
    for name in paths:
        with open(name, encoding="utf-8", errors="replace") as f:
            print(f"--- {os.path.basename(name)} (last {lines} lines)\n" + "".join(f.readlines()[-lines:]))


def trained_state(checkpoint):
    """A digest of a checkpoint's trained weights and AdamW's moments (its "model." and
    "optim." tensors), leaving out its RNG state, which is each rank's or replica's own."""
    from safetensors import safe_open
    digest = hashlib.sha256()
    with safe_open(checkpoint, "np") as f:
        for key in sorted(f.keys()):
            if key.startswith(("model.", "optim.")):
                digest.update(key.encode() + f.get_tensor(key).tobytes())
    return digest.hexdigest()
