// A classifier's evaluation metrics from per-class counts, as scikit-learn computes them
// on the same predictions (accuracy_score, and f1_score, precision_score and
// recall_score with average="macro"): the macro averages run over the classes that
// occur among the true labels or the predictions, and a class's precision or recall
// with a zero denominator counts as 0 (scikit-learn's zero_division default).
// Torch-free: the counts come from the device as plain numbers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainyard {

// Per class c: examples of class c predicted c, predictions of c, examples of class c.
struct ClassCounts {
  std::vector<double> correct, predicted, actual;
};

// {"accuracy", "f1", "precision", "recall"}, in that order. All 0 without examples.
std::vector<std::pair<std::string, double>> ClassificationMetrics(const ClassCounts& counts);

}  // namespace trainyard
