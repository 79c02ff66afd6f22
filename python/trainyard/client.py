"""Client: the coordinator's client requests (submit, status, list, cancel, logs) over
ZeroMQ with CURVE, as jobctl sends them, and what a script builds on them (wait, logs
that follow a job).

Each request is one Envelope on a fresh DEALER socket: the reply is awaited `timeout`
seconds, then the request is resent on a new socket, `retries` times in all (the ZeroMQ
Guide's Lazy Pirate pattern); a submission carries an idempotency key, so a resend never
makes two jobs. A key the coordinator does not admit ends the wait at once (its
handshake is refused, and no reply can follow). Jobs come back as dicts with the keys and
values of `jobctl --json`."""
import getpass
import os
import re
import stat
import time
import uuid

from trainyard import wire

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"
ACTIVE_STATES = ("QUEUED", "RUNNING")


class ClientError(Exception):
    """Anything the client could not do."""


class Unreachable(ClientError):
    """No reply from the coordinator after every try."""


class Refused(ClientError):
    """The coordinator's error reply, or a handshake it refused. `code` 2: the request is
    at fault (bad input, an unknown job, a cancel the key may not make); 1: a failure."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class JobFileError(ClientError, ValueError):
    """A job file or its overrides that cannot be submitted; nothing was sent."""


def _key_fields(path, secret):
    """The "public"/"secret" lines of a key file `coordinator --init` wrote. A secret key
    that other users can read is refused, as jobctl refuses it."""
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            fields = dict(line.split(" ", 1) for line in f.read().splitlines() if " " in line)
    except OSError as e:
        raise ClientError(f"{path}: cannot be read ({e.strerror}); make the keys with `coordinator --init`") from e
    if secret and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ClientError(f"{path}: other users can read this secret key; chmod 600 it")
    if "public" not in fields or (secret and "secret" not in fields):
        raise ClientError(f"{path}: not a key file of `coordinator --init`")
    return {k: v.strip() for k, v in fields.items()}


# ${VAR} and ${VAR:-default}, expanded from the environment as jobctl expands them. The
# pattern has no nested repetition: it matches in linear time on any text.
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}\n]*))?\}")


def _expand(text, source):
    def value(match):
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise JobFileError(f"{source}: ${{{name}}} is not set (set it, or write ${{{name}:-default}})")
    return _VARIABLE.sub(value, text)


def _set_key(document, dotted, value, source):
    """Sets `dotted` ("train.epochs") in a job file's mapping, making sections as needed."""
    node = document
    parts = dotted.split(".")
    if not all(parts):
        raise JobFileError(f"{source}: override '{dotted}': expected KEY.PATH, as in train.epochs")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise JobFileError(f"{source}: override '{dotted}': {part} is not a section")
    node[parts[-1]] = value


class Client:
    """A coordinator's client. `address` defaults to $TRAINYARD_COORDINATOR, else
    tcp://127.0.0.1:5555; `keys`, a folder of `coordinator --init` (client.key and
    coordinator.pub), to $TRAINYARD_KEYS, else ./keys."""

    def __init__(self, address=None, keys=None, timeout=2.5, retries=3):
        self.address = address or os.environ.get("TRAINYARD_COORDINATOR") or DEFAULT_ADDRESS
        self.keys = keys or os.environ.get("TRAINYARD_KEYS") or "keys"
        if not timeout > 0 or retries < 1:
            raise ValueError("timeout must be positive and retries at least 1")
        self.timeout, self.retries = timeout, retries
        mine = _key_fields(os.path.join(self.keys, "client.key"), secret=True)
        server = _key_fields(os.path.join(self.keys, "coordinator.pub"), secret=False)
        self._curve = (mine["public"].encode(), mine["secret"].encode(), server["public"].encode())

    # --- requests ---------------------------------------------------------------------

    def submit(self, job, overrides=None, *, name=None, ranks=None, priority=None, key=None):
        """Queues `job`, a job file's path or its keys as a dict; returns the job id. The
        job goes as it will run: `overrides` ({"train.epochs": 1}) and name, ranks and
        priority set, ${VAR} expanded from this environment. A path's relative paths
        resolve against its folder; a dict's against the current folder. A search file
        is sent with its base file's text and takes no overrides."""
        text, source, base_dir = self._job_text(job)
        changes = dict(overrides or {})
        for dotted, value in (("name", name), ("resources.ranks", ranks), ("resources.priority", priority)):
            if value is not None:
                changes[dotted] = value
        request = wire.message("SubmitRequest")(
            source=source, base_dir=base_dir, idempotency_key=key or uuid.uuid4().hex, user=getpass.getuser())
        document = self._document(_expand(text, source), source)
        if document.get("kind") == "search":
            if changes:
                raise JobFileError(f"{source}: overrides apply to job files; a search's trials take theirs from "
                                   "its base file and space")
            request.yaml = text
            self._attach_search_base(document, base_dir, request)
        else:
            for dotted, value in changes.items():
                _set_key(document, dotted, value, source)
            request.yaml = self._dump(document)
        return self._ask(submit=request).submitted.job_id

    def status(self, job_id):
        """The job, with its events, their times and a serve job's endpoints."""
        return _job_dict(self._ask(status=wire.message("StatusRequest")(job_id=job_id)).job)

    def list(self, state=None, user=None, name=None, limit=0):
        """Jobs, newest first: `state` a state name or several ("queued", ["queued",
        "running"]), `user` an exact owner, `name` a part of the name, `limit` the newest N.
        Asked a page at a time, as the coordinator answers (coordinator --list-page)."""
        states = [state] if isinstance(state, str) else list(state or [])
        job_state = wire.enum("JobState")
        numbers = []
        for s in states:
            value = job_state.values_by_name.get("JOB_" + s.upper())
            if value is None or value.number == 0:
                raise ValueError(f"state '{s}': expected queued, running, succeeded, failed, cancelled or stopped")
            numbers.append(value.number)
        request = wire.message("ListRequest")(states=numbers, user=user or "", name_contains=name or "",
                                              limit=limit)
        jobs = []
        while True:  # the coordinator answers a page at a time (ListReply in trainyard.proto)
            page = self._ask(list=request).jobs
            jobs += [_job_dict(j) for j in page.jobs]
            if page.next_before_id == 0 or (limit and len(jobs) >= limit):
                return jobs
            request.before_id = page.next_before_id
            if limit:
                request.limit = limit - len(jobs)

    def cancel(self, job_id):
        """Cancels the job (a running one stops on all its ranks); returns it. Refused
        (code 2) when the key is neither the job's owner's nor an admin's."""
        return _job_dict(self._ask(cancel=wire.message("CancelRequest")(job_id=job_id)).job)

    def wait(self, job_id, poll=1.0, timeout=None):
        """The job once it has ended (succeeded, failed, cancelled or stopped). TimeoutError
        after `timeout` seconds, if given."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.status(job_id)
            if job["state"] not in ACTIVE_STATES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout} s")
            time.sleep(poll)

    def logs(self, job_id, follow=False, poll=1.0):
        """The job's epoch rows, one dict a row (column: value, numbers as numbers); with
        `follow`, new rows as they come until the job ends."""
        seen = 0
        while True:
            reply = self._ask(logs=wire.message("LogsRequest")(job_id=job_id, after=seen)).log_rows
            columns = reply.csv_header.split(",") if reply.csv_header else []
            for line in reply.csv_lines:
                yield {c: _number_or_text(v) for c, v in zip(columns, line.split(","))}
            seen += len(reply.csv_lines)
            if not follow or _state_name(reply.job_state) not in ACTIVE_STATES:
                return
            time.sleep(poll)

    def output(self, job_id, follow=False, attempt=0, rank=None, poll=0.5):
        """The ranks' stdout and stderr of one attempt (the latest unless `attempt` is
        given), one str a line ("[rank R] " first in a job of several ranks); with `rank`,
        that job rank's lines and mpirun's own. With `follow`, lines as they come until the
        job ends, moving on to each new attempt when following the latest."""
        latest, offset = attempt == 0, 0
        while True:
            request = wire.message("LogsRequest")(job_id=job_id, output=True, attempt=attempt, offset=offset)
            if rank is not None:
                request.rank = rank
            reply = self._ask(logs=request).log_rows
            attempt = reply.attempt
            text = reply.output.decode("utf-8", errors="replace")
            yield from text.splitlines()
            moved, offset = reply.output_offset > offset, reply.output_offset
            if text or moved:
                continue
            if latest and reply.attempts > attempt:
                attempt, offset = reply.attempts, 0
                continue
            if not follow or _state_name(reply.job_state) not in ACTIVE_STATES:
                return
            time.sleep(poll)

    def artifacts(self, job_id):
        """The job's files on every host it used (its owner or an admin): a dict with
        `files` (each {path, size, host, modified}, by host then path), `unreachable` (the
        hosts not listed, and why) and `truncated`."""
        reply = self._ask(artifacts=wire.message("ArtifactsRequest")(job_id=job_id)).artifact_list
        return {"files": [{"path": f.path, "size": f.size, "host": f.host, "modified": f.modified}
                          for f in reply.files],
                "unreachable": list(reply.unreachable), "truncated": reply.truncated}

    def fetch(self, job_id, path, to=".", host=None):
        """Copies one of the job's files into the folder `to` (resuming a `<name>.part` left
        by a fetch that broke off); returns the file's path. `host` is needed when the file
        is on several hosts."""
        if host is None:
            hosts = [f["host"] for f in self.artifacts(job_id)["files"] if f["path"] == path]
            if len(hosts) != 1:
                raise Refused(2, f"job {job_id}: {path} is on {len(hosts)} hosts {hosts}; name one with host=")
            host = hosts[0]
        target = os.path.join(to, os.path.basename(path))
        part = target + ".part"
        offset = os.path.getsize(part) if os.path.exists(part) else 0
        with open(part, "ab") as out:
            size = None
            while size is None or offset < size:
                request = wire.message("FetchRequest")(job_id=job_id, path=path, host=host, offset=offset)
                reply = self._ask(fetch=request).fetched
                size = reply.size
                if offset > size or (not reply.data and offset < size):
                    raise Refused(1, f"{part} does not continue {path} on {host} ({offset} of {size} bytes)")
                out.write(reply.data)
                offset += len(reply.data)
        os.replace(part, target)
        return target

    # --- the wire ---------------------------------------------------------------------

    def _ask(self, **body):
        reply = self._request(wire.envelope(**body))
        if reply.WhichOneof("body") == "error":
            raise Refused(reply.error.code, reply.error.message)
        return reply

    def _request(self, request):
        import zmq
        payload = request.SerializeToString()
        context = zmq.Context.instance()
        for _ in range(self.retries):
            reply = self._try_once(context, payload)
            if reply is not None:
                envelope = wire.message("Envelope")()
                envelope.ParseFromString(reply)
                return envelope
        raise Unreachable(f"the coordinator at {self.address} did not answer after {self.retries} tries of "
                          f"{self.timeout} s; is it running?")

    def _try_once(self, context, payload):
        """The reply's bytes, or None when none came in time."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message
        socket = context.socket(zmq.DEALER)
        socket.linger = 0
        socket.curve_publickey, socket.curve_secretkey, socket.curve_serverkey = self._curve
        monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        try:
            socket.connect(self.address)
            socket.send(payload)
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            deadline = time.monotonic() + self.timeout
            while (left := deadline - time.monotonic()) > 0:
                ready = dict(poller.poll(left * 1000))
                if socket in ready:
                    return socket.recv()
                if monitor in ready:
                    self._raise_refused_handshake(recv_monitor_message(monitor)["event"])
            return None
        finally:
            socket.disable_monitor()
            monitor.close(0)
            socket.close(0)

    def _raise_refused_handshake(self, event):
        import zmq
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            raise Refused(2, f"the coordinator refused this client key ({self.keys}/client.key): its public key "
                             "is not on the coordinator's clients.allow (a key added there takes a SIGHUP to the "
                             "coordinator, which then re-reads the list)")
        raise Refused(2, f"the secure handshake with {self.address} failed: is it the coordinator of these keys?")

    # --- job files --------------------------------------------------------------------

    @staticmethod
    def _job_text(job):
        """(text, source name, base folder) of a path or a dict."""
        if isinstance(job, dict):
            return Client._dump(job), "<dict>", os.getcwd()
        path = os.fspath(job)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read((16 << 20) + 1)
        except (OSError, UnicodeDecodeError) as e:
            raise JobFileError(f"{path}: cannot be read: {e}") from e
        if len(text) > 16 << 20:
            raise JobFileError(f"{path}: larger than a job file may be (16 MiB)")
        return text, path, os.path.dirname(os.path.abspath(path))

    @staticmethod
    def _document(text, source):
        import yaml
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise JobFileError(f"{source}: not YAML: {e}") from e
        if not isinstance(document, dict):
            raise JobFileError(f"{source}: a job file is a mapping of keys")
        return document

    @staticmethod
    def _dump(document):
        import yaml
        return yaml.safe_dump(document, sort_keys=False)

    @staticmethod
    def _attach_search_base(document, base_dir, request):
        """A search whose base is a path: that file, resolved, and its text (the
        coordinator never opens a path a client names)."""
        base = document.get("base")
        if isinstance(base, str):
            path = os.path.normpath(os.path.join(base_dir, base))
            try:
                with open(path, encoding="utf-8") as f:
                    request.search_base_yaml = f.read()
            except OSError as e:
                raise JobFileError(f"{request.source}: base {base}: cannot be read: {e}") from e
            request.search_base_path = path


def _state_name(number):
    name = wire.enum("JobState").values_by_number.get(number)
    return name.name[len("JOB_"):] if name and number != 0 else "UNKNOWN"


def _number_or_text(cell):
    try:
        value = float(cell)
    except ValueError:
        return cell
    return value if value == value and abs(value) != float("inf") else cell


def _job_dict(info):
    """A JobInfo as `jobctl --json` prints it."""
    job = {"id": info.id, "name": info.name, "state": _state_name(info.job_state), "priority": info.priority,
           "ranks": info.ranks, "device": info.device, "attempts": info.attempts, "reason": info.reason,
           "user": info.user, "preemptible": info.preemptible, "submitted_at": info.submitted_at}
    if info.waiting:
        job["waiting"] = info.waiting
    if info.metric:
        job["metric"], job["metric_value"] = info.metric, info.metric_value
    if info.events:
        job["events"], job["event_times"] = list(info.events), list(info.event_times)
    if info.listeners:
        job["endpoints"] = [{"protocol": e.protocol, "url": e.url} for e in info.listeners]
    if info.slurm:
        job["slurm"] = info.slurm
    if info.is_search:
        job["kind"] = "search"
    if info.search_id:
        job["search"] = info.search_id
    return job
