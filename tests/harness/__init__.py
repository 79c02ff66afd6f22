"""The harness of the Python tests: what the test files share, so that a test reads as what
it asserts. A test file finds it by putting tests/ on sys.path once, at its top:

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness import check, run_case  # noqa: E402

This module holds check() (the way a test asserts), skip() (ctest's exit 77) and the mains
of test files: run_case() for a file of named cases, run_test() for a file of one test.
The other modules:
  e2e.py       small real jobs on the prepared langid data: job files, data subsets, free
               ports, polling, a run's steps and weights, safetensors edits, MPI ranks and
               stopping process groups
  pool.py      a coordinator with its keys and pools of agents on 127.0.0.1 (Cluster), and
               what tests on it share (job files, epoch logs, a standalone run's losses)
  rig.py       the cluster rig: hosts as network namespaces on one machine (Rig)
  rig_pool.py  a coordinator and agents across the rig's hosts (RigPool)
  wire.py      the coordinator's wire, from proto/trainyard.proto
  bounds.py    tolerances derived from a float64 computation, for torch tensors
This module imports nothing heavy: the rig's reaper and torch-free tests load it."""
import argparse
import os
import sys
import tempfile

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIR = os.path.dirname(TESTS_DIR)
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for the Python tests
WORKER_FLAGS = ("--worker", "--mpirun")


def check(condition, what):
    """Raises AssertionError(what) unless `condition` holds: the one way a test asserts.
    `what` says what must hold, with the values seen (a string, or any object to show). A
    failure found in a branch (a loop's end, a process that ended early) may raise
    AssertionError itself: that is what check raises."""
    if not condition:
        raise AssertionError(what)


def skip(why):
    """Ends the test as skipped (exit 77), saying why in one line."""
    print(f"skipped: {why}", flush=True)
    sys.exit(SKIPPED)


def run_case(cases, flags=WORKER_FLAGS, description=None, options=None):
    """The main of a test file of named cases: parses `flags` (each required, but --mpirun,
    which defaults to mpirun), the file's own `options(parser)`, and a case's name, then
    runs cases[name](args, work) with `work` a fresh temporary folder, removed after. A case
    asserts with check() and returns nothing; PASS is printed when it returns."""
    parser = _parser(flags, description, options)
    parser.add_argument("case", choices=sorted(cases))
    args = parser.parse_args()
    _run(cases[args.case], args)


def run_test(test, flags=("--worker",), description=None, options=None):
    """The main of a test file of one test: run_case() without a case's name."""
    _run(test, _parser(flags, description, options).parse_args())


def _parser(flags, description, options):
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in flags:
        if flag == "--mpirun":
            parser.add_argument(flag, default="mpirun")
        else:
            parser.add_argument(flag, required=True)
    if options:
        options(parser)
    return parser


def _run(test, args):
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as work:
        returned = test(args, work)
    check(returned is None, f"the test returned {returned!r}: a test asserts with check() and returns nothing")
    print("PASS", flush=True)
