#include "coordinator/search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace trainyard {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<RungResult> Results(const std::vector<double>& values) {
  std::vector<RungResult> out;
  for (size_t i = 0; i < values.size(); ++i) out.push_back({int(i + 1), values[i], false});
  return out;
}

TEST(AshaTest, TheFirstAlwaysGoesOnThenTheTopOneInEta) {
  EXPECT_TRUE(AshaPromotes({}, 0.1, true, 3));
  EXPECT_TRUE(AshaPromotes(Results({0.5}), 0.6, true, 3));
  EXPECT_FALSE(AshaPromotes(Results({0.5}), 0.4, true, 3));
  EXPECT_FALSE(AshaPromotes(Results({0.5}), 0.5, true, 3));  // an earlier equal result ranks first
  // n = 6: the best 2 go on.
  EXPECT_TRUE(AshaPromotes(Results({0.9, 0.1, 0.2, 0.3, 0.4}), 0.5, true, 3));
  EXPECT_FALSE(AshaPromotes(Results({0.9, 0.8, 0.2, 0.3, 0.4}), 0.5, true, 3));
  // Minimizing, and eta 2 (n = 4: the best 2).
  EXPECT_TRUE(AshaPromotes(Results({0.2, 0.5, 0.9}), 0.3, false, 2));
  EXPECT_FALSE(AshaPromotes(Results({0.2, 0.1, 0.9}), 0.3, false, 2));
}

TEST(AshaTest, NaNIsTheWorst) {
  EXPECT_FALSE(AshaPromotes({}, kNaN, true, 3));
  EXPECT_TRUE(AshaPromotes(Results({kNaN}), 0.0, true, 3));
  EXPECT_TRUE(AshaPromotes(Results({kNaN, kNaN}), -1.0, false, 3));
  EXPECT_TRUE(Better(1.0, kNaN, true));
  EXPECT_FALSE(Better(kNaN, 1.0, false));
}

TEST(AshaTest, MetricOfReadsTheNamedColumn) {
  EXPECT_DOUBLE_EQ(MetricOf("epoch,train_loss,eval_acc", "3,0.5,0.912000", "eval_acc"), 0.912);
  EXPECT_TRUE(std::isnan(MetricOf("epoch,eval_acc", "3,", "eval_acc")));
  EXPECT_TRUE(std::isnan(MetricOf("epoch,eval_acc", "3,nan", "eval_acc")));
  EXPECT_TRUE(std::isnan(MetricOf("epoch,eval_acc", "3,0.5x", "eval_acc")));
  EXPECT_TRUE(std::isnan(MetricOf("epoch", "3", "eval_acc")));
}

}  // namespace
}  // namespace trainyard
