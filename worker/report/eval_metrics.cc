#include "worker/report/eval_metrics.h"

#include <stdexcept>

namespace trainyard {
namespace {

double Ratio(double numerator, double denominator) { return denominator > 0 ? numerator / denominator : 0.0; }

}  // namespace

std::vector<std::pair<std::string, double>> ClassificationMetrics(const ClassCounts& counts) {
  const size_t classes = counts.correct.size();
  if (counts.predicted.size() != classes || counts.actual.size() != classes)
    throw std::invalid_argument("ClassificationMetrics: the three counts differ in length");
  double correct = 0, examples = 0, f1 = 0, precision = 0, recall = 0;
  int present = 0;
  for (size_t c = 0; c < classes; ++c) {
    correct += counts.correct[c];
    examples += counts.actual[c];
    if (counts.actual[c] == 0 && counts.predicted[c] == 0) continue;  // in neither: not averaged
    ++present;
    precision += Ratio(counts.correct[c], counts.predicted[c]);
    recall += Ratio(counts.correct[c], counts.actual[c]);
    // scikit-learn's F-score from the counts: (1 + b^2) tp / (b^2 (tp + fn) + (tp + fp)), b = 1.
    f1 += Ratio(2 * counts.correct[c], counts.actual[c] + counts.predicted[c]);
  }
  const double n = present > 0 ? double(present) : 1.0;
  return {{"accuracy", Ratio(correct, examples)}, {"f1", f1 / n}, {"precision", precision / n}, {"recall", recall / n}};
}

}  // namespace trainyard
