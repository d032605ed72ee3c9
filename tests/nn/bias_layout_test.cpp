// Weights and biases each in their own layout, as TransformerEngine's single_grouped_weight and
// single_grouped_bias choose them: every combination holds the same bits, computes the same bits,
// saves its own keys and loads from and into every other.
#include <gtest/gtest.h>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/grouplin.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::gl_options;
using testing::make_gl;

std::shared_ptr<GroupedLinear> layer(WeightLayout weights, WeightLayout biases, uint64_t seed) {
  GroupedLinearOptions o = gl_options(3, weights, seed);
  o.bias_layout = biases;
  return make_gl(o);
}

TEST(BiasLayout, EveryCombinationHoldsAndComputesTheSameBits) {
  auto reference = layer(WeightLayout::PerExpert, WeightLayout::PerExpert, 5);
  const testing::Pass want = testing::run_pass(*reference);
  for (WeightLayout w : testing::kLayouts) {
    for (WeightLayout b : testing::kLayouts) {
      SCOPED_TRACE(std::string(layout_name(w)) + " weights, " + std::string(layout_name(b)) +
                   " biases");
      auto gl = layer(w, b, 5);
      EXPECT_EQ(gl->layout(), w);
      EXPECT_EQ(gl->bias_layout(), b);
      testing::expect_same_experts(*reference, *gl);
      testing::expect_same_pass(want, testing::run_pass(*gl));
      const std::vector<std::string> keys = gl->state_dict().keys();
      EXPECT_EQ(keys.front(), w == WeightLayout::Single ? "weight" : "weight0");
      const size_t first_bias = w == WeightLayout::Single ? 1 : 3;
      EXPECT_EQ(keys[first_bias], b == WeightLayout::Single ? "bias" : "bias0");
      // The checkpoint scan sees one module, mixed when the families differ on disk.
      const std::vector<GroupedModule> found = find_grouped_modules(gl->state_dict());
      ASSERT_EQ(found.size(), 1u);
      EXPECT_EQ(found[0].mixed, checkpoint_layout(w) != checkpoint_layout(b));
    }
  }
}

TEST(BiasLayout, LoadsFromAndIntoEveryCombination) {
  for (WeightLayout sw : testing::kLayouts) {
    for (WeightLayout sb : testing::kLayouts) {
      auto src = layer(sw, sb, 7);
      const StateDict sd = src->state_dict();
      for (WeightLayout dw : testing::kLayouts) {
        for (WeightLayout db : testing::kLayouts) {
          SCOPED_TRACE(std::string(layout_name(sw)) + "/" + std::string(layout_name(sb)) + " -> " +
                       std::string(layout_name(dw)) + "/" + std::string(layout_name(db)));
          auto dst = layer(dw, db, 8);
          const LoadReport r = dst->load_state_dict(sd);
          EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
          testing::expect_same_experts(*src, *dst);
        }
      }
    }
  }
}

}  // namespace
}  // namespace grouplin
