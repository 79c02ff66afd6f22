#!/usr/bin/env python3
"""The cluster rig itself (tests/harness/rig.py): three hosts, each with its own
hostname, address, disk and /dev/shm, that reach each other by name over ssh and by
nothing from the machine's own network; and that leave no namespace, link, process or
folder behind, after a clean end, after a failure, and after the test's process is
killed outright (SIGKILL, as ctest's timeout does). Exit 77 (skipped) where namespaces
cannot be made."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import TESTS_DIR, check, run_test  # noqa: E402
from harness.rig import Rig, leftovers, skip_unless_available  # noqa: E402


NOTHING = {"namespaces": [], "links": [], "processes": []}


def killed_outright():
    """A process whose rig is up is killed with SIGKILL: the rig's reaper tears it down."""
    code = "import sys, time; sys.path.insert(0, sys.argv[1]); from harness.rig import Rig; c = Rig(2); c.up(); " \
           "print(c.prefix, c.root, flush=True); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code, TESTS_DIR], stdout=subprocess.PIPE, text=True)
    try:
        words = child.stdout.readline().split()
        check(len(words) == 2, f"a rig came up in a child process (it exited {child.poll()})")
        prefix, root = words
        while_up = leftovers(prefix)
        child.kill()
        child.wait()
        deadline = time.time() + 30
        while (leftovers(prefix) != NOTHING or os.path.exists(root)) and time.time() < deadline:
            time.sleep(0.2)
        check(len(while_up["namespaces"]) == 3 and while_up["processes"] and leftovers(prefix) == NOTHING and
              not os.path.exists(root),
              f"after the test's process is killed outright, nothing left: {leftovers(prefix)}, "
              f"{root} {'still there' if os.path.exists(root) else 'removed'} (while up: {while_up})")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test(args, work):
    skip_unless_available()
    with Rig(3) as c:
        prefix = c.prefix
        names = [c.run(h, ["hostname"], capture_output=True, text=True).stdout.strip() for h in c.names]
        check(names == ["h1", "h2", "h3"], f"each host has its own hostname: {names}")
        hop = c.run("h1", ["ssh", "-F", f"{c.shared}/ssh_config", "h3", "hostname; echo $TMPDIR"],
                    capture_output=True, text=True, timeout=30)
        check(hop.stdout.split() == ["h3", os.path.join(c.host_dir, "tmp")],
              f"h1 reaches h3 over ssh, which gives it h3's own TMPDIR: {hop.stdout.split()} {hop.stderr.strip()}")
        resolved = c.run("h2", ["getent", "hosts", "h3"], capture_output=True, text=True).stdout.split()
        check(resolved[:1] == [c.address("h3")], f"h2 resolves h3 to {resolved[:1]}")
        c.run("h1", ["sh", "-c", f"echo mine > {c.host_dir}/runs/written-on-h1"], check=True)
        seen = {h: c.run(h, ["test", "-e", f"{c.host_dir}/runs/written-on-h1"]).returncode == 0 for h in c.names}
        check(seen == {"h1": True, "h2": False, "h3": False},
              f"a file written in h1's runs folder is on h1's disk only: {seen}")
        c.run("h1", ["sh", "-c", f"echo mine > /dev/shm/{prefix}-h1"], check=True)
        shm = {h: c.run(h, ["test", "-e", f"/dev/shm/{prefix}-h1"]).returncode == 0 for h in c.names}
        shm["machine"] = os.path.exists(f"/dev/shm/{prefix}-h1")
        check(shm == {"h1": True, "h2": False, "h3": False, "machine": False},
              f"a file written in h1's /dev/shm is in h1's only: {shm}")
        machine = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        check("198.18." not in machine, "the machine's own namespace has no rig address")
        check(sorted(leftovers(prefix)["namespaces"]) == sorted([c.namespace(h) for h in c.names] +
                                                                 [f"{prefix}sw"]), "four namespaces while up")
    check(leftovers(prefix) == {"namespaces": [], "links": [], "processes": []},
          f"after a clean end, nothing left: {leftovers(prefix)}")
    try:
        with Rig(2) as c:
            prefix = c.prefix
            raise RuntimeError("a test fails inside the rig")
    except RuntimeError:
        pass
    check(leftovers(prefix) == {"namespaces": [], "links": [], "processes": []},
          f"after a failure, nothing left: {leftovers(prefix)}")
    killed_outright()


if __name__ == "__main__":
    run_test(test, (), __doc__)
