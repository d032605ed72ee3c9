// The one expert-name rule, and that the checkpoint scan and GroupedLinear's load agree on it.
#include "layout/expert_names.hpp"

#include <gtest/gtest.h>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/load_state_dict.hpp"

namespace grouplin {
namespace {

TEST(ExpertNames, CanonicalDecimalIndicesOnly) {
  EXPECT_EQ(layout::expert_index("weight0", "weight"), 0);
  EXPECT_EQ(layout::expert_index("weight12", "weight"), 12);
  EXPECT_EQ(layout::expert_index("bias7", "bias"), 7);
  EXPECT_EQ(layout::expert_index("weight999999999", "weight"), 999999999);  // 9 digits
  for (const char* leaf : {"weight", "weight_scale", "weight012", "weight00", "weight-1",
                           "weight+1", "weight1a", "weight 1", "weight1234567890", "bias3"}) {
    EXPECT_EQ(layout::expert_index(leaf, "weight"), std::nullopt) << leaf;
  }
  EXPECT_EQ(layout::expert_key("a.b.", "bias", 3), "a.b.bias3");
  EXPECT_EQ(layout::split_key("a.b.weight3").prefix, "a.b.");
  EXPECT_EQ(layout::split_key("a.b.weight3").leaf, "weight3");
  EXPECT_EQ(layout::split_key("weight3").prefix, "");
}

TEST(ExpertNames, LayoutVocabulary) {
  EXPECT_EQ(layout_name(ExpertLayout::Single), "single");
  EXPECT_EQ(layout_name(WeightLayout::Contiguous), "contiguous");
  EXPECT_EQ(weight_layout_from_name("contiguous"), WeightLayout::Contiguous);
  EXPECT_EQ(weight_layout_from_name("stacked"), std::nullopt);
  EXPECT_EQ(checkpoint_layout(WeightLayout::Contiguous), ExpertLayout::PerExpert);
  EXPECT_EQ(checkpoint_layout(WeightLayout::PerExpert), ExpertLayout::PerExpert);
  EXPECT_EQ(checkpoint_layout(WeightLayout::Single), ExpertLayout::Single);
}

// Regression: the scan accepted 9 digits and GroupedLinear's load 18, so "weight1234567890" was
// an ordinary entry for `inspect`/`convert` and an ExpertCountMismatch for load_state_dict.
TEST(ExpertNames, ScanAndLoadAgreeOnWhatIsAnExpertEntry) {
  GroupedLinearOptions o;
  o.num_gemms = 2;
  o.in_features = 3;
  o.out_features = 2;
  o.bias = false;
  GroupedLinear layer(o);
  StateDict sd = layer.state_dict();
  sd.insert("weight1234567890", Tensor::zeros({2, 3}, DType::F32));  // 10 digits: not an expert

  const GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_TRUE(scan.problems.empty());
  ASSERT_EQ(scan.modules.size(), 1u);
  EXPECT_EQ(scan.modules[0].num_experts, 2);
  EXPECT_EQ(scan.modules[0].keys, (std::vector<std::string>{"weight0", "weight1"}));

  GroupedLinear other(o);
  const LoadReport r = other.load_state_dict(sd, {.strict = false});
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"weight1234567890"}));
  try {
    other.load_state_dict(sd);
    FAIL() << "strict load accepted an unexpected key";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::UnexpectedKey) << e.what();
  }

  // 9 digits is an expert index for both: a partial set for the scan, too many for the load.
  sd.erase("weight1234567890");
  sd.insert("weight123456789", Tensor::zeros({2, 3}, DType::F32));
  EXPECT_EQ(scan_grouped_modules(sd).problems.at(0).code(), ErrorCode::PartialExpertSet);
  try {
    other.load_state_dict(sd);
    FAIL() << "load accepted expert 123456789 of 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ExpertCountMismatch) << e.what();
  }
}

}  // namespace
}  // namespace grouplin
