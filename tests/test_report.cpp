// report.html's axes: round ticks, none below zero for non-negative data, readable labels.
#include <gtest/gtest.h>

#include <cmath>

#include "hyla/io/svg.h"

namespace hyla {
namespace {

// The step is 1, 2 or 5 × 10^k and every tick a whole multiple of it.
void expect_round(const Axis& a) {
  const double decade = std::pow(10.0, std::floor(std::log10(a.step) + 1e-9));
  const double mantissa = a.step / decade;
  EXPECT_TRUE(std::fabs(mantissa - 1) < 1e-9 || std::fabs(mantissa - 2) < 1e-9 || std::fabs(mantissa - 5) < 1e-9)
      << a.step;
  for (double t : a.ticks) EXPECT_NEAR(t / a.step, std::round(t / a.step), 1e-9) << t;
}

TEST(Report, LearningRateFromZeroGetsRoundNonNegativeTicks) {
  // Warm-up from 0 to the demo's peak of 2e-3.
  const Axis a = value_axis(0.0, 2e-3);
  expect_round(a);
  EXPECT_DOUBLE_EQ(a.lo, 0.0);
  EXPECT_GE(a.hi, 2e-3);
  for (double t : a.ticks) EXPECT_GE(t, 0.0);
  EXPECT_EQ(a.ticks, (std::vector<double>{0, 5e-4, 1e-3, 1.5e-3, 2e-3}));
  std::vector<std::string> labels;
  for (double t : a.ticks) labels.push_back(tick_label(t, a.step));
  EXPECT_EQ(labels, (std::vector<std::string>{"0", "0.0005", "0.0010", "0.0015", "0.0020"}));
}

TEST(Report, ValueAxisCoversTheDataAndStaysAtOrAboveZero) {
  const std::pair<double, double> ranges[] = {{3.31, 8.42}, {0.0, 1.0}, {1e-5, 3e-4}, {120, 23950}, {0.3, 0.3}, {0.3, 0.7}};
  for (auto [lo, hi] : ranges) {
    const Axis a = value_axis(lo, hi);
    expect_round(a);
    EXPECT_LE(a.lo, lo + 1e-12);
    EXPECT_GE(a.hi, hi);
    EXPECT_GE(a.lo, 0.0) << lo;
    EXPECT_LE(a.ticks.size(), 8u) << lo << ".." << hi;
    EXPECT_DOUBLE_EQ(a.ticks.front(), a.lo);
    EXPECT_DOUBLE_EQ(a.ticks.back(), a.hi);
  }
  // Loss from 8.42 down to 3.31: ticks every 2 from 2 to 10, not 3.0535, 4.332, ...
  EXPECT_EQ(value_axis(3.31, 8.42).ticks, (std::vector<double>{2, 4, 6, 8, 10}));
  // 0.3 / 0.1 is 2.9999999999999996: a range that starts on a multiple up to rounding gets no
  // extra tick below it.
  EXPECT_EQ(value_axis(0.3, 0.7).ticks.size(), 5u);
  // Nor does a learning rate that went through float on its way (0.0020000000949949026).
  EXPECT_EQ(value_axis(double(5e-5f), double(2e-3f)).ticks.size(), 5u);
}

TEST(Report, StepAxisKeepsTheRunsRangeAndTicksRoundStepsInside) {
  const Axis a = step_axis(1, 550);
  expect_round(a);
  EXPECT_DOUBLE_EQ(a.lo, 1);
  EXPECT_DOUBLE_EQ(a.hi, 550);
  EXPECT_EQ(a.ticks, (std::vector<double>{100, 200, 300, 400, 500}));
  EXPECT_EQ(tick_label(300, a.step), "300");
}

TEST(Report, TickLabelsUseTheDecimalsTheStepNeeds) {
  EXPECT_EQ(tick_label(2.5, 0.5), "2.5");
  EXPECT_EQ(tick_label(20000, 5000), "20000");
  EXPECT_EQ(tick_label(-1e-19, 0.001), "0");
}

}  // namespace
}  // namespace hyla
