#!/usr/bin/env python3
"""The coordinator daemon and jobctl as real processes on 127.0.0.1:
  - a submission repeated with the same idempotency key makes exactly one job;
  - a malformed or invalid job file is rejected at submit with the worker's file:line
    error (exit 2) and no row is written;
  - kill -9 of the coordinator and a restart ~1 s later: the queue is identical;
  - cancel of a queued job;
  - an unreachable coordinator is a clear error (exit 1) after the retries, not a hang,
    and a malformed endpoint is bad input (exit 2);
  - a corrupt state database is refused (exit 2) unless --fresh."""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "worker"))
from e2e_common import free_port  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



class Daemon:
    def __init__(self, binary, state, port, *extra):
        self.proc = subprocess.Popen([binary, "--listen", f"tcp://127.0.0.1:{port}", "--state", state, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=10)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", required=True)
    p.add_argument("--jobctl", required=True)
    a = p.parse_args()
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    checks = {}

    def jobctl(*args, timeout=30):
        return subprocess.run([a.jobctl, "--coordinator", endpoint, "--timeout", "2", *args],
                              capture_output=True, text=True, timeout=timeout)

    def listing():
        r = jobctl("--json", "list")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    with tempfile.TemporaryDirectory() as work:
        state = os.path.join(work, "state.db")
        daemon = Daemon(a.coordinator, state, port)
        job = os.path.join(SOURCE, "configs", "jobs", "langid_tiny.yaml")
        first = jobctl("submit", job, "--key", "same-key")
        again = jobctl("submit", job, "--key", "same-key")
        checks["duplicate key makes one job"] = (first.stdout == again.stdout and len(listing()) == 1)

        bad = os.path.join(work, "bad.yaml")
        text = open(job).read().replace("../../data", os.path.join(SOURCE, "data"))
        open(bad, "w").write(text.replace("  preset: tiny", "  presett: tiny"))
        rejected = jobctl("submit", bad)
        print("bad job:", rejected.stderr.strip())
        checks["bad job rejected with file:line, no row"] = (
            rejected.returncode == 2 and f"{bad}:" in rejected.stderr and "model.presett: unknown key" in rejected.stderr
            and len(listing()) == 1)
        malformed = os.path.join(work, "malformed.yaml")
        open(malformed, "w").write("name: [unclosed\n")
        checks["malformed job rejected"] = jobctl("submit", malformed).returncode == 2 and len(listing()) == 1

        for name in ("benchmark_grid.yaml", "train_step_bench.yaml"):
            jobctl("submit", os.path.join(SOURCE, "configs", "jobs", name))
        cancelled = jobctl("--json", "cancel", "2")
        checks["cancel a queued job"] = json.loads(cancelled.stdout)["state"] == "CANCELLED"
        before = listing()
        daemon.kill(signal.SIGKILL)
        time.sleep(1.0)
        daemon = Daemon(a.coordinator, state, port)
        after = listing()
        print("queue before kill -9:", [(j["id"], j["name"], j["state"]) for j in before])
        print("queue after restart: ", [(j["id"], j["name"], j["state"]) for j in after])
        checks["queue identical after kill -9 and restart"] = before == after and len(after) == 3
        daemon.kill(signal.SIGTERM)

        start = time.time()
        lost = subprocess.run([a.jobctl, "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.3",
                               "--retries", "2", "list"], capture_output=True, text=True, timeout=30)
        print("unreachable:", lost.stderr.strip().splitlines()[-1], f"({time.time() - start:.1f} s)")
        checks["unreachable coordinator is a clear error"] = (lost.returncode == 1 and "did not answer" in lost.stderr
                                                             and time.time() - start < 5)
        malformed = subprocess.run([a.jobctl, "--coordinator", "127.0.0.1:5555", "list"], capture_output=True,
                                   text=True, timeout=30)
        checks["a malformed endpoint is bad input"] = (malformed.returncode == 2 and
                                                       "not a usable ZeroMQ endpoint" in malformed.stderr)

        corrupt = os.path.join(work, "corrupt.db")
        open(corrupt, "wb").write(b"x" * 8192)
        refused = subprocess.run([a.coordinator, "--listen", f"tcp://127.0.0.1:{free_port()}", "--state", corrupt],
                                 capture_output=True, text=True, timeout=10)
        fresh = Daemon(a.coordinator, corrupt, port, "--fresh")
        time.sleep(0.3)
        checks["corrupt database refused unless --fresh"] = (
            refused.returncode == 2 and "corrupt" in refused.stderr and listing() == [])
        fresh.kill(signal.SIGTERM)

    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
