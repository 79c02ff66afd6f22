#!/usr/bin/env python3
"""Where a ctest run's time went, against the budgets in docs/testing.md.

    scripts/test_times.py --log CTEST_OUTPUT --build BUILD_DIR [--budgets docs/testing.md]

Reads each finished test's seconds from ctest's output and its labels from
`ctest --show-only=json-v1`, and prints the slowest tests, the time per label beside the
label's budget, and every test over its own budget. A test's budget is the largest of its
labels' budgets for one test, so a test labelled `pool mpi search` is held to `search`'s.
Timings on a shared machine are noisy, so an overrun is reported, not failed."""
import argparse
import json
import os
import re
import subprocess
import sys

RESULT = re.compile(r"^ *\d+/\d+ Test +#\d+: (\S+) \.+.*?([0-9.]+) sec$")
BUDGET_ROW = re.compile(r"^\| `([a-z0-9_]+)` \| (\d+) \| (\d+) \|")
BUDGETS_HEADING = "## Time budgets"


def seconds_by_test(log_path):
    times = {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = RESULT.match(line.rstrip("\n"))
            if match:
                times[match.group(1)] = float(match.group(2))
    return times


def labels_by_test(build_dir):
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, capture_output=True, text=True,
                           check=True)
    labels = {}
    for test in json.loads(shown.stdout)["tests"]:
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                labels[test["name"]] = prop["value"]
        labels.setdefault(test["name"], [])
    return labels


def read_budgets(path):
    """{label: (seconds for one test, test-seconds for all of them)} from the table under
    the page's "Time budgets" heading."""
    budgets, inside = {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                inside = line.strip() == BUDGETS_HEADING
            elif inside:
                match = BUDGET_ROW.match(line)
                if match:
                    budgets[match.group(1)] = (int(match.group(2)), int(match.group(3)))
    if not budgets:
        sys.exit(f"{path}: no budget table under '{BUDGETS_HEADING}' (rows like | `unit` | 10 | 120 |)")
    return budgets


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="ctest's output")
    parser.add_argument("--build", required=True, help="the build folder ctest ran in")
    parser.add_argument("--budgets", default=os.path.join(os.path.dirname(__file__), "..", "docs", "testing.md"))
    parser.add_argument("--slowest", type=int, default=10)
    args = parser.parse_args()
    times = seconds_by_test(args.log)
    if not times:
        return
    labels = labels_by_test(args.build)
    budgets = read_budgets(args.budgets)

    print(f"the {args.slowest} slowest tests:")
    for name, sec in sorted(times.items(), key=lambda item: -item[1])[: args.slowest]:
        print(f"  {sec:8.1f} s  {name}")

    print("time per label (test-seconds; a test with several labels counts in each):")
    totals = {}
    for name, sec in times.items():
        for label in labels.get(name, []):
            count, total = totals.get(label, (0, 0.0))
            totals[label] = (count + 1, total + sec)
    for label, (count, total) in sorted(totals.items(), key=lambda item: -item[1][1]):
        one, whole = budgets.get(label, (None, None))
        verdict = "no budget in docs/testing.md" if whole is None else \
            f"budget {whole} s{'  OVER' if total > whole else ''}"
        print(f"  {label:10s} {total:8.1f} s in {count:3d} tests   {verdict}")

    over = []
    for name, sec in times.items():
        allowed = [budgets[label][0] for label in labels.get(name, []) if label in budgets]
        if allowed and sec > max(allowed):
            over.append((name, sec, max(allowed)))
    if over:
        print("tests over their budget for one test (docs/testing.md, Time budgets):")
        for name, sec, allowed in sorted(over, key=lambda item: -item[1]):
            print(f"  {sec:8.1f} s  {name} (budget {allowed} s)")
    else:
        print("no test is over its budget (docs/testing.md, Time budgets)")


if __name__ == "__main__":
    main()
