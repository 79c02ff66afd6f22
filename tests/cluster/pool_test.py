#!/usr/bin/env python3
"""A worker pool across hosts of the cluster rig (tests/harness/rig.py): the
coordinator runs on h1, listening on h1's address with CURVE; two agents run on h2 and two
on h3, each host's started by its own mpirun; jobctl talks to the coordinator from h1 over
TCP. A 4-rank job is placed across h2 and h3 (its mpirun, started by the lead agent,
reaches the other host over ssh) and succeeds with a standalone 4-rank run's losses, bit
for bit. `jobctl workers` and the dashboard's API show every agent's host.
Exit 77 (skipped) where the rig cannot be made."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402
from harness.e2e import job_yaml, subset_tsv, wait_for, write  # noqa: E402
from harness.pool import POOL_FLAGS  # noqa: E402
from harness.rig import Rig, skip_unless_available  # noqa: E402
from harness.rig_pool import RigPool  # noqa: E402


def standalone_final(c, args, job):
    """The same job as 1 host x 4 ranks, without a pool."""
    runs = os.path.join(c.host_dir, "standalone")
    r = c.run("h1", c.mpirun({"h1": 4}, [args.worker, job, "--runs-dir", runs], args.mpirun), capture_output=True,
              text=True, timeout=300)
    check(r.returncode == 0, r.stderr[-3000:])
    with open(c.outside("h1", "standalone/across/summary.json")) as f:
        return json.load(f)["final"]


def test(args, work):
    skip_unless_available()
    with Rig(3) as c:
        pool = RigPool(c, args)
        try:
            pool.start_coordinator()
            pool.start_agents("h2", 2)
            pool.start_agents("h3", 2)
            workers = wait_for(lambda: (lambda w: w if len(w) == 4 else None)(pool.workers()), 60, "4 agents")
            hosts = sorted(w["host"] for w in workers)
            check(hosts == ["h2", "h2", "h3", "h3"], f"jobctl workers, from h1, shows the agents' hosts: {hosts}")
            job = write(os.path.join(c.shared, "across.yaml"),
                        job_yaml("across", subset_tsv(c.shared, 640),
                                 "train:\n  batch_size: 8\n  epochs: 2\n  max_steps: 24\nresources:\n  ranks: 4\n"))
            job_id = pool.jobctl("submit", job)["job_id"]
            final = wait_for(lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
                pool.jobctl("status", str(job_id))), 240, "the job to end")
            check(final["state"] == "SUCCEEDED", f"the job ends {final['state']}")
            report = pool.jobctl("report", str(job_id))
            host_of = {w["world"]: w["host"] for w in workers}
            placement = report["attempts"][0]["placement"]
            placed = sorted(host_of.get(agent.rsplit(":", 1)[0]) for agent in placement.split(","))
            check(placed == ["h2", "h2", "h3", "h3"], f"it was placed on both hosts: {placement}")
            api = pool.api("/api/workers") or {}
            seen = sorted({w.get("host") for w in (api if isinstance(api, list) else api.get("workers", []))})
            check(seen == ["h2", "h3"], f"the dashboard's API shows the hosts: {seen}")
            check(len(report["epochs"]) == 2 and len(report["attempts"]) == 1,
                  f"2 epochs reported, in 1 attempt ({len(report['attempts'])})")
            lead_host = host_of.get(placement.split(",")[0].rsplit(":", 1)[0])
            check(report.get("summary", {}).get("host") == lead_host,
                  f"the job's summary names its model's host: {report.get('summary', {}).get('host')} "
                  f"({report.get('summary', {}).get('model_dir')})")
            pooled = report.get("summary", {}).get("final")
            alone = standalone_final(c, args, job)
            check(pooled == alone, f"its final losses equal a standalone 1 x 4 run's: {pooled} / {alone}")
        except BaseException:
            pool.dump_logs()
            raise


if __name__ == "__main__":
    run_test(test, POOL_FLAGS, __doc__)
