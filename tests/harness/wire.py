"""The coordinator's wire for Python tests: the messages of proto/trainyard.proto as
protobuf classes, and a client that sends one Envelope over ZeroMQ with CURVE, as jobctl
and the agents do.

The classes are built when first asked for, from the descriptor set Debian's protoc
writes for the .proto (`protoc --descriptor_set_out`), not from generated code: a
descriptor is data, so the Python protobuf runtime of the venv reads it whatever protoc
version wrote it. The protocol version is kProtocolVersion of proto/wire_version.h."""
import functools
import os
import subprocess
import tempfile

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(SOURCE, "proto")
_classes = {}


@functools.lru_cache(maxsize=None)
def protocol_version():
    """kProtocolVersion, read from proto/wire_version.h (once)."""
    with open(os.path.join(PROTO_DIR, "wire_version.h")) as header:
        for line in header:
            if "kProtocolVersion =" in line:
                return int(line.split("=")[1].strip(" ;\n"))
    raise RuntimeError("no kProtocolVersion in proto/wire_version.h")


def _load():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "wire.desc")
        subprocess.run(["protoc", f"--proto_path={PROTO_DIR}", "--include_imports", f"--descriptor_set_out={out}",
                        os.path.join(PROTO_DIR, "trainyard.proto")], check=True, capture_output=True)
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    for proto in files.file:
        for message in proto.message_type:
            name = f"{proto.package}.{message.name}" if proto.package else message.name
            _classes[message.name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def message(name):
    """The class of the wire's message `name` (e.g. "Envelope", "Register")."""
    if not _classes:
        _load()
    return _classes[name]


def envelope(**body):
    """An Envelope of the current protocol version holding one body field, e.g.
    envelope(register=message("Register")(...))."""
    return message("Envelope")(version=protocol_version(), **body)


def read_keys(folder, client_key):
    """(public, secret) of `client_key` (e.g. "worker.key") and the coordinator's public
    key, from a key folder made by `coordinator --init`."""
    def fields(name):
        with open(os.path.join(folder, name)) as f:
            return dict(line.split(" ", 1) for line in f.read().splitlines())
    mine = fields(client_key)
    with open(os.path.join(folder, "coordinator.pub")) as f:
        server = f.read().split(" ", 1)[1]
    return mine["public"].strip(), mine["secret"].strip(), server.strip()


def ask(endpoint, keys, request, timeout_ms=5000):
    """Sends one Envelope over a fresh CURVE DEALER socket and returns the reply Envelope,
    or None when none came within timeout_ms. keys: read_keys()'s triple."""
    import zmq
    context = zmq.Context()
    s = context.socket(zmq.DEALER)
    try:
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = (k.encode() for k in keys)
        s.linger = 0
        s.connect(endpoint)
        s.send(request.SerializeToString())
        if not s.poll(timeout_ms):
            return None
        return message("Envelope").FromString(s.recv())
    finally:
        s.close()
        context.term()
