#!/usr/bin/env python3
"""An evaluation's classification metrics against scikit-learn's on the same
predictions: accuracy_score, and f1_score, precision_score and recall_score with
average="macro" and their default label set (the classes among the true labels or the
predictions) and zero_division. The cases are seeded random label vectors: balanced and
imbalanced, classes that are never predicted, classes predicted but absent from the
truth, classes in neither (not averaged), one class, perfect and all-wrong predictions.
A metric agrees when it is within 4 roundings of its value (|d| <= 4 * 2^-53 * max(1,
|v|)): ours is a mean of the same per-class ratios, summed in another order."""
import json
import os
import subprocess
import sys

import numpy as np
from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, run_test  # noqa: E402


def cases():
    rng = np.random.default_rng(20261129)
    yield "balanced, 4 classes", 4, rng.integers(0, 4, 500), rng.integers(0, 4, 500)
    truth = rng.choice(6, 700, p=[0.6, 0.2, 0.1, 0.05, 0.04, 0.01])
    noisy = np.where(rng.random(700) < 0.7, truth, rng.integers(0, 6, 700))
    yield "imbalanced, 6 classes", 6, truth, noisy
    yield "never predicted class 2", 3, rng.integers(0, 3, 200), rng.integers(0, 2, 200)
    yield "predicted class absent from the truth", 4, rng.integers(0, 3, 200), rng.integers(0, 4, 200)
    yield "classes 5..9 in neither", 10, rng.integers(0, 5, 300), rng.integers(0, 5, 300)
    yield "one class", 1, np.zeros(50, int), np.zeros(50, int)
    labels = rng.integers(0, 20, 1000)
    yield "perfect, 20 classes", 20, labels, labels
    yield "all wrong", 3, np.zeros(90, int), np.ones(90, int)
    yield "many classes, few examples", 50, rng.integers(0, 50, 60), rng.integers(0, 50, 60)


def reference(truth, predicted):
    return {"accuracy": accuracy_score(truth, predicted),
            "f1": f1_score(truth, predicted, average="macro"),
            "precision": precision_score(truth, predicted, average="macro"),
            "recall": recall_score(truth, predicted, average="macro")}


def test(args, work):
    import warnings
    warnings.simplefilter("ignore")  # scikit-learn warns of every zero division it counts as 0
    failures = 0
    for name, classes, truth, predicted in cases():
        pairs = "".join(f"{t} {p}\n" for t, p in zip(truth, predicted))
        ours = json.loads(subprocess.run([args.probe, "eval-metrics", str(classes)], input=pairs, text=True,
                                         capture_output=True, check=True).stdout)
        for metric, value in reference(truth, predicted).items():
            bound = 4 * 2.0 ** -53 * max(1.0, abs(value))
            ok = abs(ours[metric] - value) <= bound
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {metric} ours {ours[metric]!r} scikit-learn {value!r}")
    print(f"{failures} of {sum(1 for _ in cases()) * 4} metrics disagree")
    check(not failures, f"{failures} metrics disagree with scikit-learn's (the FAIL lines above)")


if __name__ == "__main__":
    run_test(test, ("--probe",), __doc__)
