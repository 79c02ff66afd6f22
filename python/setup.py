"""Builds the client with the coordinator's wire: at build time, protoc describes
proto/trainyard.proto as a descriptor set (trainyard/wire.desc, data the protobuf runtime
reads whatever protoc version wrote it) and kProtocolVersion is read from
proto/wire_version.h into trainyard/_protocol.py. TRAINYARD_PROTO_DIR names another
proto folder; by default it is the repository's, beside this folder."""
import os
import re
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithWire(build_py):
    def run(self):
        proto_dir = os.environ.get("TRAINYARD_PROTO_DIR", os.path.join(HERE, "..", "proto"))
        package = os.path.join(HERE, "trainyard")
        proto = os.path.join(proto_dir, "trainyard.proto")
        if not os.path.isfile(proto):
            raise SystemExit(f"error: {proto} not found: build from a Trainyard checkout, or set TRAINYARD_PROTO_DIR")
        subprocess.run(["protoc", f"--proto_path={proto_dir}", "--include_imports",
                        f"--descriptor_set_out={os.path.join(package, 'wire.desc')}", proto], check=True)
        with open(os.path.join(proto_dir, "wire_version.h")) as header:
            found = re.search(r"kProtocolVersion = (\d+);", header.read())
        if not found:
            raise SystemExit(f"error: no kProtocolVersion in {proto_dir}/wire_version.h")
        with open(os.path.join(package, "_protocol.py"), "w") as out:
            out.write(f'"""Written at build time from proto/wire_version.h."""\nVERSION = {found.group(1)}\n')
        super().run()


setup(packages=["trainyard"], package_data={"trainyard": ["wire.desc"]}, cmdclass={"build_py": BuildWithWire})
