"""The coordinator's wire messages (proto/trainyard.proto) as protobuf classes, built from
the descriptor set written at install (wire.desc), and the protocol version they speak."""
import os

from trainyard._protocol import VERSION as PROTOCOL_VERSION

_classes = {}


def _load():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.desc"), "rb") as f:
        files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    for proto in files.file:
        for message in proto.message_type:
            name = f"{proto.package}.{message.name}" if proto.package else message.name
            _classes[message.name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        for enum in proto.enum_type:
            full = f"{proto.package}.{enum.name}" if proto.package else enum.name
            _classes[enum.name] = pool.FindEnumTypeByName(full)


def message(name):
    """The class of the wire's message `name` ("Envelope", "ListRequest", ...)."""
    if not _classes:
        _load()
    return _classes[name]


def enum(name):
    """The descriptor of the wire's enum `name` ("JobState")."""
    return message(name)


def envelope(**body):
    """An Envelope of this protocol version holding one body field."""
    return message("Envelope")(version=PROTOCOL_VERSION, **body)
