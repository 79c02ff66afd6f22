"""The cluster rig: real hosts on one machine (Rig), what the cluster tests run on.

Each host is a Linux network namespace (its own interfaces, addresses and ports) with a
UTS namespace (its own hostname) and a mount namespace in which <rig>/host is that host's
own folder: its runs/ and its $TMPDIR live there, so no two hosts share a disk, while the
build and the data are the machine's, read by all, and so is /dev, read-only (a host may
use its devices, not unlink or replace them). Each host also has its own /dev/shm (a
tmpfs of its own, gone with the host): Open MPI's shared-memory segments are named by
hostname and job id, and Slurm gives two rigs the same job ids on hosts of the same names,
so with one /dev/shm for the machine, two rigs at once opened each other's segments (and
a killed rank's segments outlived its rig). Hosts are joined by veth pairs on a
bridge that lives in a namespace of its own, with addresses from 198.18.0.0/15 (the
benchmarking range), and resolve each other by name (/etc/hosts, per host).

Open MPI reaches the other hosts as on a real cluster: each host runs a real sshd
(Debian's openssh-server) with keys the rig makes, and mpirun's remote-launch agent is
`ssh -F <rig>/shared/ssh_config`. (An agent that enters a host's namespaces directly
would work too, but would test less: ssh is what users have.)

`down()` kills every process in the rig's namespaces and deletes them, after a failure
too (the context manager calls it); `leftovers()` says what a rig left behind, for a test
to check. A test killed outright (ctest's timeout sends SIGKILL, which no `finally`
survives) cannot call `down()`: a reaper does it instead. `up()` starts it as a Python
process running reap(PREFIX, ROOT), detached from the test's process tree (ctest kills
that tree), with stdin the read end of a pipe whose only write end the test holds. The
end closes however the test ends, and the reaper then tears down whatever the rig left.
Needs root, iproute2, util-linux's unshare and nsenter, and sshd; `available()` says in
one line why not."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from harness import TESTS_DIR, skip

SUBNET = "198.18.0.0/24"
SSHD = "/usr/sbin/sshd"
PREFIX = "tyc"  # every namespace and link a rig makes starts with it
# The reaper's program (see the module's text): `python -c REAPER TESTS_DIR PREFIX ROOT`.
REAPER = "import sys; sys.path.insert(0, sys.argv[1]); from harness.rig import reap; reap(sys.argv[2], sys.argv[3])"


def available():
    """'' when a rig can be made here, else why not (one line)."""
    if os.geteuid() != 0:
        return "the cluster rig needs root (network, UTS and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"the cluster rig needs {tool}"
    if not os.path.exists(SSHD):
        return f"the cluster rig needs {SSHD} (Debian's openssh-server)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return "network namespaces cannot be made here: " + made.stderr.strip()
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def skip_unless_available():
    """Skips the test (exit 77) with one line where a rig cannot be made here."""
    why = available()
    if why:
        skip(why)


def leftovers(prefix=PREFIX):
    """Namespaces and links whose names start with `prefix`, and processes in them."""
    spaces = [line.split()[0] for line in
              subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
              if line.startswith(prefix)]
    links = [line.split(":")[1].strip().split("@")[0] for line in
             subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
             if line.split(":")[1].strip().startswith(prefix)]
    processes = [pid for space in spaces for pid in
                 subprocess.run(["ip", "netns", "pids", space], capture_output=True, text=True).stdout.split()]
    return {"namespaces": spaces, "links": links, "processes": processes}


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


class Rig:
    """N hosts named h1..hN, at 198.18.0.11.. (see the module's text)."""

    def __init__(self, hosts, work=None, keep=False):
        self.count = hosts
        self.keep = keep or work is not None
        self.id = f"{os.getpid() % 100000:05d}{int(time.time() * 1000) % 100:02d}"
        self.prefix = f"{PREFIX}{self.id}"
        self.root = work or tempfile.mkdtemp(prefix="trainyard-cluster-")
        self.shared = os.path.join(self.root, "shared")
        self.names = [f"h{i}" for i in range(1, hosts + 1)]
        self.init = {}  # host -> pid of the process that holds its namespaces
        self.processes = []  # what the rig started, reaped at down()
        self.sshd = {}
        self.up_ = False
        self.reaper_pipe = None  # the write end the reaper waits on

    # --- paths and names -----------------------------------------------------------------
    @property
    def host_dir(self):
        """The same path on every host, each host's own folder there."""
        return os.path.join(self.root, "host")

    def outside(self, host, path=""):
        """Where `host`'s own folder is, seen from outside the rig."""
        return os.path.join(self.root, "hosts", host, path)

    def address(self, host):
        return f"198.18.0.{10 + self.names.index(host) + 1}"

    def namespace(self, host):
        return f"{self.prefix}{host}"

    def hostfile(self, slots):
        """A hostfile giving each host in `slots` ({host: count}) that many slots."""
        path = os.path.join(self.shared, f"hostfile-{'-'.join(f'{h}x{n}' for h, n in slots.items())}")
        with open(path, "w") as f:
            f.writelines(f"{host} slots={count}\n" for host, count in slots.items())
        return path

    def mpirun_args(self):
        """What mpirun needs to launch across the rig's hosts: ssh as its remote agent, and
        the rig's network for its own links and for MPI's TCP transport."""
        return ["--mca", "plm", "rsh", "--mca", "plm_rsh_agent", f"ssh -F {self.shared}/ssh_config",
                "--mca", "oob_tcp_if_include", SUBNET, "--mca", "btl_tcp_if_include", SUBNET]

    def mpirun(self, slots, argv, mpirun="mpirun"):
        """An mpirun command line, to run on one of the rig's hosts, that starts len(slots)
        hosts' worth of `argv`: {host: ranks}, ranks dealt in that order (h1's first). As
        root, Open MPI wants consent on every host, so it is forwarded (-x)."""
        return [mpirun, "--hostfile", self.hostfile(slots), "-n", str(sum(slots.values())), "--bind-to", "none",
                "--wd", self.root, "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                *self.mpirun_args(), *argv]

    def environment(self, **extra):
        return dict(os.environ, TMPDIR=os.path.join(self.host_dir, "tmp"), OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)

    # --- running things on a host ----------------------------------------------------------
    def enter(self, host):
        return ["nsenter", "-t", str(self.init[host]), "-n", "-u", "-m", "--wd=" + self.root]

    def run(self, host, argv, env=None, **kwargs):
        return subprocess.run(self.enter(host) + argv, env=env or self.environment(), **kwargs)

    def popen(self, host, argv, env=None, **kwargs):
        return subprocess.Popen(self.enter(host) + argv, env=env or self.environment(), **kwargs)

    def pids(self, host, commands=None):
        """The processes in `host`'s network namespace (those whose command name is in
        `commands`, if given)."""
        out = subprocess.run(["ip", "netns", "pids", self.namespace(host)], capture_output=True, text=True).stdout
        found = []
        for pid in out.split():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    command = f.read().strip()
            except OSError:
                continue
            if commands is None or command in commands:
                found.append(int(pid))
        return found

    def link(self, host, up):
        """Takes `host`'s one network link down (as a pulled cable would) or up again."""
        run(["ip", "-n", self.namespace(host), "link", "set", "eth0", "up" if up else "down"])

    def kill(self, host, commands, timeout=10):
        """SIGKILL to `host`'s processes named in `commands` (None: every process, as a
        power cut would; the host is then gone), until none is left."""
        deadline = time.time() + timeout
        while pids := self.pids(host, commands):
            if time.time() > deadline:
                raise RuntimeError(f"{host}: {commands} still running after {timeout} s: {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def power_off(self, host):
        """`host` goes as a power cut takes it: its link first, so that nothing it had open
        says goodbye to its peers (no FIN, no RST), then every process on it. Its disk stays."""
        self.link(host, up=False)
        self.kill(host, None)

    def power_on(self, host):
        """`host` boots again after power_off: the same name, address and disk, its link up
        and its sshd running, and nothing else."""
        self.hold(host)
        self.link(host, up=True)
        self.start_sshd(host)

    # --- up and down ---------------------------------------------------------------------
    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self):
        self.up_ = True
        self.start_reaper()
        try:
            self.write_shared_files()
            switch = f"{self.prefix}sw"
            run(["ip", "netns", "add", switch])
            run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
            run(["ip", "-n", switch, "link", "set", "br0", "up"])
            for i, host in enumerate(self.names, start=1):
                self.add_host(i, host, switch)
            for host in self.names:
                self.start_sshd(host)
            self.wait_for_ssh()
        except BaseException:
            self.down()
            raise

    def write_shared_files(self):
        os.makedirs(self.shared, exist_ok=True)
        os.makedirs(self.host_dir, exist_ok=True)
        for name in ("host_key", "user_key"):
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"trainyard-cluster-{name}", "-f",
                 os.path.join(self.shared, name)])
        shutil.copy(os.path.join(self.shared, "user_key.pub"), os.path.join(self.shared, "authorized_keys"))
        with open(os.path.join(self.shared, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{self.address(h)} {h}\n" for h in self.names))
        with open(os.path.join(self.shared, "ssh_config"), "w") as f:
            f.write(f"Host {' '.join(self.names)}\n  User root\n  IdentityFile {self.shared}/user_key\n"
                    "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                    "  ConnectTimeout 30\n  ServerAliveInterval 5\n  ServerAliveCountMax 3\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation folder

    def add_host(self, i, host, switch):
        space, outer, inner = self.namespace(host), f"{self.prefix}b{i}", f"{self.prefix}v{i}"
        for folder in ("tmp", "runs"):
            os.makedirs(self.outside(host, folder), exist_ok=True)
        run(["ip", "netns", "add", space])
        run(["ip", "link", "add", inner, "type", "veth", "peer", "name", outer])
        run(["ip", "link", "set", inner, "netns", space])
        run(["ip", "link", "set", outer, "netns", switch])
        run(["ip", "-n", switch, "link", "set", outer, "master", "br0", "up"])
        run(["ip", "-n", space, "link", "set", inner, "name", "eth0"])
        run(["ip", "-n", space, "addr", "add", f"{self.address(host)}/24", "dev", "eth0"])
        run(["ip", "-n", space, "link", "set", "eth0", "up"])
        run(["ip", "-n", space, "link", "set", "lo", "up"])
        self.hold(host)

    def hold(self, host):
        """Starts the process holding `host`'s UTS and mount namespaces (and sitting in its
        network namespace): its pid is how everything else enters the host."""
        space = self.namespace(host)
        pid_file = os.path.join(self.shared, f"init-{host}")
        if os.path.exists(pid_file):
            os.remove(pid_file)
        # /dev is the machine's, bound read-only: its devices work as ever, but nothing on a
        # host can unlink or replace one (a /dev/null replaced by a regular file breaks every
        # process on the machine that reads or writes it).
        script = (f"hostname {host} && mount --bind {self.outside(host)} {self.host_dir} && "
                  "mount --rbind /dev /dev && mount -o remount,bind,ro /dev && "
                  "mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm && "
                  f"mount --bind {self.shared}/hosts /etc/hosts && echo $$ > {pid_file} && exec sleep infinity")
        self.processes.append(subprocess.Popen(
            ["ip", "netns", "exec", space, "unshare", "--uts", "--mount", "--propagation", "private", "--fork", "sh",
             "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.time() + 10
        while not (os.path.exists(pid_file) and open(pid_file).read().strip()):
            if time.time() > deadline:
                raise RuntimeError(f"host {host} did not come up")
            time.sleep(0.02)
        self.init[host] = int(open(pid_file).read())

    def start_sshd(self, host):
        config = os.path.join(self.shared, f"sshd-{host}.conf")
        with open(config, "w") as f:
            f.write(f"ListenAddress {self.address(host)}\nHostKey {self.shared}/host_key\nPidFile none\n"
                    f"AuthorizedKeysFile {self.shared}/authorized_keys\nPermitRootLogin prohibit-password\n"
                    "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    f"PrintMotd no\nSetEnv TMPDIR={self.host_dir}/tmp\n")
        log = open(os.path.join(self.shared, f"sshd-{host}.log"), "w")
        self.sshd[host] = self.popen(host, [SSHD, "-D", "-e", "-f", config], stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(self.sshd[host])

    def wait_for_ssh(self):
        first = self.names[0]
        for host in self.names:
            deadline = time.time() + 15
            while True:
                r = self.run(first, ["ssh", "-F", f"{self.shared}/ssh_config", host, "hostname"], capture_output=True,
                             text=True, timeout=20)
                if r.returncode == 0 and r.stdout.strip() == host:
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"ssh from {first} to {host} failed: {r.stderr.strip()}")
                time.sleep(0.1)

    def start_reaper(self):
        """The reaper of a test killed outright (see the module's docstring)."""
        read_end, self.reaper_pipe = os.pipe()  # neither end is inherited by what the test starts
        try:
            subprocess.run([sys.executable, "-c", REAPER, TESTS_DIR, self.prefix, "" if self.keep else self.root],
                           stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, check=True)
        finally:
            os.close(read_end)

    def down(self):
        """Kills every process in the rig's namespaces and deletes them. Idempotent."""
        if not self.up_:
            return
        tear_down(self.prefix, None if self.keep else self.root, self.processes)
        self.up_ = False
        if self.reaper_pipe is not None:
            os.close(self.reaper_pipe)  # the reaper finds nothing left and ends
            self.reaper_pipe = None


def tear_down(prefix, root=None, processes=()):
    """Kills every process in the namespaces named `prefix`..., deletes them and the links
    so named, and removes `root` when given. Idempotent."""
    spaces = leftovers(prefix)["namespaces"]
    for _ in range(50):
        pids = [pid for space in spaces for pid in
                subprocess.run(["ip", "netns", "pids", space], capture_output=True, text=True).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    for space in spaces:
        subprocess.run(["ip", "netns", "del", space], capture_output=True)
    for link in leftovers(prefix)["links"]:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    if root:
        shutil.rmtree(root, ignore_errors=True)


def reap(prefix, root):
    """The reaper: leaves the process tree that started it (its parent returns at once, so
    this process belongs to init), waits for end of file on stdin, then tears down."""
    if os.fork() > 0:
        os._exit(0)
    sys.stdin.buffer.read()
    tear_down(prefix, root or None)


def on_rig(hosts, case):
    """A run_case() case that runs case(c, args) on a fresh rig c of `hosts` hosts, taken
    down after it; the test is skipped (exit 77) where no rig can be made."""
    def run(args, work):
        skip_unless_available()
        with Rig(hosts) as c:
            case(c, args)
    return run
