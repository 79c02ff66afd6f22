"""A real Slurm cluster on the cluster rig (harness/rig.py): Debian's slurmctld on one host,
a slurmd on each of the others, and a munged on every host, all from the distribution's
packages (slurmctld, slurmd, slurm-client, munge, libpmix-dev).

Each host keeps its own state: its munge socket, spool, logs and the TmpFS under which
Slurm's PMIx plugin makes each step's folder live in the host's own folder, and
/etc/slurm is bound, in each host's mount namespace, to one configuration the rig writes
(so the daemons and the clients use Slurm's default path). The node names are the hosts'
names: each slurmd finds its node by its own hostname. What the configuration sets, and
why:
  - MpiDefault=pmix: `srun` starts Debian's Open MPI ranks directly through PMIx (its
    Open MPI has no PMI-1/2 support, so pmix is the only direct launch);
  - proctrack/linuxproc, task/affinity, jobacct_gather/none and CgroupPlugin=cgroup/v1:
    nothing uses cgroups, which a host's fresh /sys does not show (autodetect would stop
    slurmd);
  - cred_expire=10, sched_interval=2, SlurmdTimeout=5, KillWait=5: a requeued job is
    eligible again after 10 s instead of 120, and a lost node is noticed within seconds;
  - no accounting storage; JobCompType=jobcomp/filetxt, so `sacct -c` lists every job.
Every daemon is a process in its host's namespaces, so the rig's down() ends them all.
`available()` says in one line why a Slurm rig cannot be made here."""
import os
import shutil
import subprocess
import time

DAEMONS = ("slurmctld", "slurmd", "munged", "srun", "salloc", "sbatch", "scontrol", "sinfo")
PMIX = "/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so"


def available():
    """'' when Slurm can run on the rig here, else why not (one line)."""
    for tool in DAEMONS:
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"a Slurm rig needs {tool} (Debian's slurmctld, slurmd, slurm-client and munge)"
    if not os.path.exists(PMIX):
        return f"a Slurm rig needs {PMIX} (Debian's libpmix-dev), which Slurm's PMIx plugin loads"
    if not os.path.isdir("/etc/slurm"):
        return "a Slurm rig needs /etc/slurm (made by Debian's slurm packages) to bind its configuration on"
    return ""


class Slurm:
    """Slurm on `cluster`: slurmctld on `controller`, a slurmd on each of `nodes` (each
    with `cpus` CPUs), one partition `rig` of all the nodes."""

    def __init__(self, cluster, controller="h1", nodes=None, cpus=2):
        self.c = cluster
        self.controller = controller
        self.nodes = nodes or [h for h in cluster.names if h != controller]
        self.cpus = cpus
        self.etc = os.path.join(cluster.shared, "etc-slurm")
        self.configured = False

    def state(self, host, path=""):
        """`host`'s Slurm folder (logs, spool), seen from outside the rig."""
        return self.c.outside(host, os.path.join("slurm", path))

    def configure(self):
        """The configuration, each host's folders and its /etc/slurm, without a daemon."""
        if self.configured:
            return self
        self.write_configuration()
        for host in self.c.names:
            for folder in ("slurm/d", "slurm/ctld", "munge", "tmp"):
                os.makedirs(self.c.outside(host, folder), exist_ok=True)
            os.chmod(self.c.outside(host, "munge"), 0o755)
            subprocess.run(["nsenter", "-t", str(self.c.init[host]), "-m", "mount", "--bind", self.etc, "/etc/slurm"],
                           check=True, capture_output=True, text=True)
        self.configured = True
        return self

    def up(self, timeout=30):
        self.configure()
        for host in self.c.names:
            self.start(host, ["munged", "-F", "-f", f"--key-file={self.c.shared}/munge.key",
                              f"--socket={self.c.host_dir}/munge/munge.socket.2",
                              f"--pid-file={self.c.host_dir}/munge/munged.pid",
                              f"--seed-file={self.c.host_dir}/munge/seed",
                              f"--log-file={self.c.host_dir}/munge/munged.log"], "munged.out")
        deadline = time.time() + timeout
        for host in self.c.names:
            self.wait(lambda: os.path.exists(self.c.outside(host, "munge/munge.socket.2")), deadline,
                      f"munged on {host}")
        self.start(self.controller, ["slurmctld", "-D", "-i"], "slurmctld.out")
        self.wait(lambda: "UP" in self.client(["scontrol", "ping"]).stdout, deadline, "slurmctld")
        for host in self.nodes:
            self.start(host, ["slurmd", "-D"], "slurmd.out")
        want = f"idle {len(self.nodes)}"
        self.wait(lambda: self.client(["sinfo", "-h", "-o", "%t %D"]).stdout.strip() == want, deadline,
                  f"{len(self.nodes)} idle nodes")
        return self

    def start(self, host, argv, log_name):
        log = open(self.c.outside(host, os.path.join("slurm", log_name)), "w")
        env = {k: v for k, v in self.c.environment().items() if k != "SLURM_CONF"}
        self.c.processes.append(self.c.popen(host, argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True))

    def wait(self, ready, deadline, what):
        while not ready():
            if time.time() > deadline:
                raise RuntimeError(f"Slurm rig: {what} not ready in time; logs: {self.logs()}")
            time.sleep(0.1)

    def client(self, argv, host=None, timeout=60, **env):
        """A Slurm client command on `host` (the controller by default); its CompletedProcess."""
        return self.c.run(host or self.controller, argv, env=self.c.environment(**env), capture_output=True,
                          text=True, timeout=timeout)

    def logs(self):
        """The daemons' logs, tail of each, for a failure message."""
        out = []
        for host in self.c.names:
            for name in ("munged.out", "slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
                path = self.state(host, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        out.append(f"--- {host}/{name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def write_configuration(self):
        os.makedirs(self.etc, exist_ok=True)
        key = os.path.join(self.c.shared, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        state = os.path.join(self.c.host_dir, "slurm")
        nodes = "".join(f"NodeName={h} NodeAddr={self.c.address(h)} CPUs={self.cpus} State=UNKNOWN\n"
                        for h in self.nodes)
        with open(os.path.join(self.etc, "slurm.conf"), "w") as f:
            f.write(f"""ClusterName=rig
SlurmctldHost={self.controller}({self.c.address(self.controller)})
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.c.host_dir}/munge/munge.socket.2,cred_expire=10
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/d
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={state}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SchedulerParameters=sched_interval=2,bf_interval=1
ReturnToService=2
SlurmdTimeout=5
MessageTimeout=5
KillWait=5
MailProg=/bin/true
TmpFS={self.c.host_dir}/tmp
MinJobAge=600
{nodes}PartitionName=rig Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        with open(os.path.join(self.etc, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\n")
