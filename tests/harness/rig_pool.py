"""A worker pool across the hosts of the cluster rig (harness/rig.py), as real processes
(RigPool): the coordinator on h1, listening on h1's address with CURVE, agents on the other
hosts, each host's started by its own mpirun, and jobctl run on h1 over TCP."""
import json
import os
import subprocess
import sys

from harness import check
from harness.e2e import print_tails
from harness.rig import SUBNET

PORT = 5555
HTTP = 8265


class RigPool:
    """The coordinator on h1 and agents on the other hosts, all as real processes."""

    def __init__(self, c, args, liveness=10, port=PORT, http=HTTP, tag=""):
        """On the rig `c`, with the binaries of `args` (POOL_FLAGS). `tag` tells a second
        coordinator's keys, state and runs folder from the first's."""
        self.c, self.args, self.liveness, self.http, self.tag = c, args, liveness, http, tag
        self.keys = os.path.join(c.shared, "keys" + tag)
        self.runs = "runs" + tag  # in each host's own folder
        self.endpoint = f"tcp://{c.address('h1')}:{port}"
        subprocess.run([args.coordinator, "--init", "--keys", self.keys], check=True, capture_output=True)
        self.logs = []

    def log(self, name):
        f = open(os.path.join(self.c.shared, name + ".log"), "w")
        self.logs.append(f.name)
        return f

    def coordinator_command(self, extra=()):
        state = os.path.join(self.c.host_dir, f"state{self.tag}.db")
        return [self.args.coordinator, "--listen", self.endpoint, "--state", state, "--runs",
                os.path.join(self.c.host_dir, self.runs), "--keys", self.keys, "--http", f"127.0.0.1:{self.http}",
                "--heartbeat", "0.5", "--liveness", str(self.liveness), "--grace", "20", "--restart-backoff", "1",
                *extra]

    def start_coordinator(self):
        self.c.popen("h1", self.coordinator_command(), stdout=self.log("coordinator" + self.tag),
                     stderr=subprocess.STDOUT)

    def agent_environment(self):
        """What an agent's host needs so that the job mpiruns it starts reach the other
        hosts: ssh with the rig's keys, and the rig's network for Open MPI's traffic."""
        return self.c.environment(OMPI_MCA_plm="rsh", OMPI_MCA_plm_rsh_agent=f"ssh -F {self.c.shared}/ssh_config",
                                  OMPI_MCA_oob_tcp_if_include=SUBNET, OMPI_MCA_btl_tcp_if_include=SUBNET)

    def start_agents(self, host, count):
        self.c.popen(host, [self.args.mpirun, "-n", str(count), "--bind-to", "none", "--oversubscribe",
                            self.args.worker, "--coordinator", self.endpoint, "--keys", self.keys,
                            "--allow-run-as-root", "--heartbeat", "0.5", "--liveness", "4"],
                     env=self.agent_environment(), stdout=self.log(f"agents{self.tag}-{host}"),
                     stderr=subprocess.STDOUT)

    def jobctl(self, *argv):
        """jobctl --json's answer, run on h1; AssertionError when jobctl fails."""
        r = self.c.run("h1", [self.args.jobctl, "--coordinator", self.endpoint, "--keys", self.keys, "--timeout", "3",
                              "--json", *argv], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"jobctl {' '.join(argv)}: {r.stderr}")
        return json.loads(r.stdout)

    def workers(self):
        try:
            return self.jobctl("workers")
        except AssertionError:
            return []

    def http_text(self, path):
        """GET `path` of the dashboard, from h1; None when it does not answer."""
        fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{self.http}{path}').read().decode())"
        r = self.c.run("h1", [sys.executable, "-c", fetch], capture_output=True, text=True, timeout=30)
        return r.stdout if r.returncode == 0 else None

    def api(self, path):
        text = self.http_text(path)
        return json.loads(text) if text is not None else None

    def dump_logs(self):
        print_tails(self.logs, 30)


def pool_job_pid(c, host):
    """The pid of the job process (`worker --pool-job`, not its agent) on the rig's `host`;
    None if none runs."""
    for pid in c.pids(host, ("worker",)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--pool-job" in f.read().split(b"\0"):
                    return pid
        except OSError:
            pass
    return None
