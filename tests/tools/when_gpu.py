#!/usr/bin/env python3
"""Runs a gpu-labelled test only where a GPU can be: `when_gpu.py COMMAND ARGS...` exits
77 (ctest: skipped), saying why, on a machine with no NVIDIA device node, before the test
loads torch or CUDA (seconds a test, for each gpu test on every CPU-only run). Where the
node exists the command runs as it is (a .py file with this interpreter), and its own
check decides."""
import os
import runpy
import sys

DEVICE_NODE = "/dev/nvidiactl"

if len(sys.argv) < 2:
    print("usage: when_gpu.py SCRIPT.py|PROGRAM [ARGS...]", file=sys.stderr)
    sys.exit(2)
if not os.path.exists(DEVICE_NODE):
    print(f"skipped: no GPU on this machine ({DEVICE_NODE} does not exist)")
    sys.exit(77)
command = sys.argv[1:]
if not command[0].endswith(".py"):
    os.execvp(command[0], command)
sys.argv = command
sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
runpy.run_path(command[0], run_name="__main__")
