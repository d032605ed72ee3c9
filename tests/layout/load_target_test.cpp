// The last step of a load's plan (layout/load_target.hpp): the planned entries rewritten in the
// names each GroupedLinear holds, checked against its expert count once, FP8 codes and scales
// handed over as the two entries they are.
#include "layout/load_target.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "layout/planned_tensor.hpp"

namespace grouplin {
namespace {

using layout::fit_load_targets;
using layout::LoadFindings;
using layout::LoadTarget;

constexpr int64_t kN = 4, kOut = 3, kIn = 5;

LoadTarget target(WeightLayout layout, bool fp8 = false) {
  return {"m.", kN, kOut, kIn, layout, false, WeightLayout::PerExpert, fp8};
}

std::vector<std::string> names(const std::vector<PlannedTensor>& ts) {
  std::vector<std::string> out;
  for (const PlannedTensor& t : ts) out.push_back(t.name);
  return out;
}

const PlannedTensor& named(const std::vector<PlannedTensor>& ts, const std::string& name) {
  auto it = std::find_if(ts.begin(), ts.end(), [&](const auto& t) { return t.name == name; });
  EXPECT_NE(it, ts.end()) << name;
  return *it;
}

TEST(LoadTarget, AStackedEntryBecomesViewsOfEachExpertForAPerExpertModule) {
  const Tensor w = Tensor::zeros({kN, kOut, kIn}, DType::BF16);
  std::vector<PlannedTensor> ts = {PlannedTensor::of("m.weight", w),
                                   PlannedTensor::of("other", Tensor::zeros({2}, DType::F32))};
  const LoadFindings f = fit_load_targets(ts, {target(WeightLayout::Contiguous)}, true);
  EXPECT_TRUE(f.problems.empty());
  EXPECT_EQ(names(ts), (std::vector<std::string>{"other", "m.weight0", "m.weight1", "m.weight2",
                                                 "m.weight3"}));
  const PlannedTensor& e2 = named(ts, "m.weight2");
  EXPECT_EQ(e2.shape, (Shape{kOut, kIn}));
  ASSERT_EQ(e2.pieces.size(), 1u);
  EXPECT_EQ(e2.pieces[0].data(), w.select(2).data());  // a view, no copy
  EXPECT_EQ(f.origins.at("m.weight2"), "m.weight");
  ASSERT_EQ(f.conversions.size(), 1u);
  EXPECT_EQ(f.conversions[0].module, "m");
  EXPECT_EQ(f.conversions[0].from, ExpertLayout::Single);
  EXPECT_EQ(f.conversions[0].to, WeightLayout::Contiguous);

  // The module's own form passes as it is.
  std::vector<PlannedTensor> same = {PlannedTensor::of("m.weight", w)};
  EXPECT_TRUE(fit_load_targets(same, {target(WeightLayout::Single)}, true).conversions.empty());
  EXPECT_EQ(names(same), std::vector<std::string>{"m.weight"});
}

TEST(LoadTarget, ExpertCountIsCheckedOnceAgainstTheModule) {
  std::vector<PlannedTensor> ts = {
      PlannedTensor::of("m.weight", Tensor::zeros({kN + 1, kOut, kIn}, DType::F32))};
  const LoadFindings f = fit_load_targets(ts, {target(WeightLayout::PerExpert)}, false);
  ASSERT_EQ(f.problems.size(), 1u);
  EXPECT_EQ(f.problems[0].code, ErrorCode::ExpertCountMismatch);
  EXPECT_EQ(f.problems[0].key, "m.weight");
  EXPECT_TRUE(ts.empty());                               // not also unexpected
  EXPECT_EQ(f.covered.size(), static_cast<size_t>(kN));  // nor its experts missing
}

TEST(LoadTarget, APartialSetIsAProblemOnlyWhenStrict) {
  auto partial = [] {
    std::vector<PlannedTensor> ts;
    for (int e : {0, 2}) {
      ts.push_back(PlannedTensor::of("m.weight" + std::to_string(e),
                                     Tensor::zeros({kOut, kIn}, DType::F32)));
    }
    return ts;
  };
  std::vector<PlannedTensor> ts = partial();
  LoadFindings f = fit_load_targets(ts, {target(WeightLayout::Single)}, true);
  std::vector<std::string> keys;
  for (const Problem& p : f.problems) {
    EXPECT_EQ(p.code, ErrorCode::PartialExpertSet);
    keys.push_back(p.key);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"m.weight1", "m.weight3"}));
  EXPECT_NE(f.problems[0].message.find("2 of 4"), std::string::npos) << f.problems[0].message;

  ts = partial();
  f = fit_load_targets(ts, {target(WeightLayout::Single)}, false);
  EXPECT_TRUE(f.problems.empty());
  EXPECT_EQ(names(ts), (std::vector<std::string>{"m.weight0", "m.weight2"}));  // into slices
  ASSERT_EQ(f.conversions.size(), 1u);
  EXPECT_EQ(f.conversions[0].from, ExpertLayout::PerExpert);
}

TEST(LoadTarget, Fp8CodesAndScalesReachAnFp8ModuleAsTwoEntries) {
  const Tensor codes = Tensor::zeros({kN, kOut, kIn}, DType::F8_E4M3);
  const Tensor scales = Tensor::zeros({kN, 1, 1}, DType::F32);
  std::vector<PlannedTensor> ts = {PlannedTensor::of("m.weight", codes),
                                   PlannedTensor::of("m.weight_scale_inv", scales)};
  const LoadFindings f = fit_load_targets(ts, {target(WeightLayout::PerExpert, true)}, true);
  EXPECT_TRUE(f.problems.empty());
  for (int64_t e = 0; e < kN; ++e) {
    const std::string w = "m.weight" + std::to_string(e);
    const PlannedTensor& c = named(ts, w);
    EXPECT_EQ(c.dtype, DType::F8_E4M3);
    EXPECT_FALSE(c.dequantize.has_value());
    const PlannedTensor& s = named(ts, w + "_scale_inv");
    EXPECT_EQ(s.shape, (Shape{1, 1}));
    EXPECT_EQ(f.origins.at(w + "_scale_inv"), "m.weight_scale_inv");
  }
  EXPECT_EQ(ts.size(), static_cast<size_t>(2 * kN));

  // Codes without their scales, and values, are refused by name.
  std::vector<PlannedTensor> bare = {PlannedTensor::of("m.weight", codes)};
  LoadFindings g = fit_load_targets(bare, {target(WeightLayout::Single, true)}, true);
  ASSERT_EQ(g.problems.size(), 1u);
  EXPECT_EQ(g.problems[0].code, ErrorCode::Fp8ScalesNotApplied);
  EXPECT_NE(g.problems[0].message.find("\"m.weight_scale_inv\""), std::string::npos);
  std::vector<PlannedTensor> values = {
      PlannedTensor::of("m.weight", Tensor::zeros({kN, kOut, kIn}, DType::BF16))};
  g = fit_load_targets(values, {target(WeightLayout::Single, true)}, true);
  ASSERT_EQ(g.problems.size(), 1u);
  EXPECT_EQ(g.problems[0].code, ErrorCode::UnsupportedConversion);
}

TEST(LoadTarget, BothLayoutsAreOneProblemAndNothingLoads) {
  std::vector<PlannedTensor> ts = {
      PlannedTensor::of("m.weight", Tensor::zeros({kN, kOut, kIn}, DType::F32)),
      PlannedTensor::of("m.weight1", Tensor::zeros({kOut, kIn}, DType::F32))};
  const LoadFindings f = fit_load_targets(ts, {target(WeightLayout::PerExpert)}, false);
  ASSERT_EQ(f.problems.size(), 1u);
  EXPECT_EQ(f.problems[0].code, ErrorCode::BothLayoutsPresent);
  EXPECT_TRUE(ts.empty());
}

}  // namespace
}  // namespace grouplin
