#!/usr/bin/env python3
"""A worker pool across hosts of the cluster rig (tests/cluster/cluster.py): the
coordinator runs on h1, listening on h1's address with CURVE; two agents run on h2 and two
on h3, each host's started by its own mpirun; jobctl talks to the coordinator from h1 over
TCP. A 4-rank job is placed across h2 and h3 (its mpirun, started by the lead agent,
reaches the other host over ssh) and succeeds with a standalone 4-rank run's losses, bit
for bit. `jobctl workers` and the dashboard's API show every agent's host.
Exit 77 (skipped) where the rig cannot be made."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "worker"))

from cluster import SUBNET, Cluster, check, skip_unless_available  # noqa: E402
from e2e_common import job_yaml, subset_tsv, wait_for, write  # noqa: E402

PORT = 5555
HTTP = 8265


class Pool:
    """The coordinator on h1 and agents on the other hosts, all as real processes."""

    def __init__(self, c, args, liveness=10, port=PORT, http=HTTP, tag=""):
        """`tag` tells a second coordinator's keys, state and runs folder from the first's."""
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
        r = self.c.run("h1", [self.args.jobctl, "--coordinator", self.endpoint, "--keys", self.keys, "--timeout", "3",
                              "--json", *argv], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError(f"jobctl {' '.join(argv)}: {r.stderr}")
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
        for name in self.logs:
            with open(name, encoding="utf-8", errors="replace") as f:
                print(f"--- {os.path.basename(name)} (last 30 lines)\n" + "".join(f.readlines()[-30:]))


def standalone_final(c, args, job):
    """The same job as 1 host x 4 ranks, without a pool."""
    runs = os.path.join(c.host_dir, "standalone")
    r = c.run("h1", c.mpirun({"h1": 4}, [args.worker, job, "--runs-dir", runs], args.mpirun), capture_output=True,
              text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(c.outside("h1", "standalone/across/summary.json")) as f:
        return json.load(f)["final"]


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--coordinator", "--jobctl", "--worker"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--mpirun", default="mpirun")
    args = parser.parse_args()
    skip_unless_available()
    ok = True
    with Cluster(3) as c:
        pool = Pool(c, args)
        try:
            pool.start_coordinator()
            pool.start_agents("h2", 2)
            pool.start_agents("h3", 2)
            workers = wait_for(lambda: (lambda w: w if len(w) == 4 else None)(pool.workers()), 60, "4 agents")
            hosts = sorted(w["host"] for w in workers)
            ok &= check(hosts == ["h2", "h2", "h3", "h3"], f"jobctl workers, from h1, shows the agents' hosts: {hosts}")
            job = write(os.path.join(c.shared, "across.yaml"),
                        job_yaml("across", subset_tsv(c.shared, 640),
                                 "train:\n  batch_size: 8\n  epochs: 2\n  max_steps: 24\nresources:\n  ranks: 4\n"))
            job_id = pool.jobctl("submit", job)["job_id"]
            final = wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
                pool.jobctl("status", str(job_id))), 240, "the job to end")
            ok &= check(final["state"] == "SUCCEEDED", f"the job ends {final['state']}")
            report = pool.jobctl("report", str(job_id))
            host_of = {w["world"]: w["host"] for w in workers}
            placement = report["attempts"][0]["placement"]
            placed = sorted(host_of.get(agent.rsplit(":", 1)[0]) for agent in placement.split(","))
            ok &= check(placed == ["h2", "h2", "h3", "h3"], f"it was placed on both hosts: {placement}")
            api = pool.api("/api/workers") or {}
            seen = sorted({w.get("host") for w in (api if isinstance(api, list) else api.get("workers", []))})
            ok &= check(seen == ["h2", "h3"], f"the dashboard's API shows the hosts: {seen}")
            ok &= check(len(report["epochs"]) == 2 and len(report["attempts"]) == 1,
                        f"2 epochs reported, in 1 attempt ({len(report['attempts'])})")
            lead_host = host_of.get(placement.split(",")[0].rsplit(":", 1)[0])
            ok &= check(report.get("summary", {}).get("host") == lead_host,
                        f"the job's summary names its model's host: {report.get('summary', {}).get('host')} "
                        f"({report.get('summary', {}).get('model_dir')})")
            pooled = report.get("summary", {}).get("final")
            alone = standalone_final(c, args, job)
            ok &= check(pooled == alone, f"its final losses equal a standalone 1 x 4 run's: {pooled} / {alone}")
        except BaseException:
            pool.dump_logs()
            raise
        if not ok:
            pool.dump_logs()
    print("PASS" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
