// GroupedLinear numerics: forward, dgrad, wgrad and bgrad against the double reference in
// reference.hpp (tolerances explained there), for N in {1, 3, 8, 64}, odd and larger shapes,
// uniform / skewed / empty-expert / single-expert / T = 0 routings, F32 and BF16; the three
// weight layouts bit-identical at init and through forward and backward; zero-row experts;
// fuse_wgrad_accumulation; SGD.
#include "grouplin/grouped_linear.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "grouplin/optimizer.hpp"
#include "nn/load_test_util.hpp"
#include "nn/reference.hpp"

namespace grouplin {
namespace {

using reference::close_to;
using reference::Ref;
using reference::to_double;

using testing::kLayouts;

using testing::random_tensor;

GroupedLinearOptions options(int64_t n, int64_t in, int64_t out, DType dtype, WeightLayout layout,
                             bool bias = true) {
  return testing::gl_options(n, layout, /*seed=*/1234, bias, dtype, in, out);
}

int64_t total(const std::vector<int64_t>& splits) {
  int64_t t = 0;
  for (int64_t m : splits) t += m;
  return t;
}

struct Case {
  std::string name;
  int64_t in, out;
  std::vector<int64_t> splits;  // N = splits.size()
  bool bias = true;
};
// Keeps CTest's test names short: GoogleTest would otherwise print the struct's raw bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<int64_t> random_routing(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> s(static_cast<size_t>(n));
  for (int64_t& m : s) m = gen() % 10 < 3 ? 0 : static_cast<int64_t>(gen() % 6);
  return s;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"N1_odd", 5, 3, {7}},
      {"N1_empty", 5, 3, {0}},
      {"N3_odd_uniform", 5, 3, {4, 4, 4}},
      {"N3_odd_skewed", 5, 3, {1, 10, 2}},
      {"N3_odd_middle_only", 5, 3, {0, 6, 0}},
      {"N3_odd_all_to_last", 5, 3, {0, 0, 9}},
      {"N3_T0", 5, 3, {0, 0, 0}},
      {"N3_no_bias", 7, 9, {2, 0, 5}, false},
      {"N8_uniform", 16, 24, {8, 8, 8, 8, 8, 8, 8, 8}},
      {"N8_skewed_empties", 16, 24, {1, 0, 30, 2, 0, 5, 0, 7}},
      {"N64_odd_random", 5, 3, random_routing(64, 7)},
      {"N3_large_skewed", 96, 80, {250, 0, 50}},  // large enough for threaded BLAS paths
  };
  return all;
}

class ReferenceTest : public ::testing::TestWithParam<std::tuple<Case, DType>> {};

TEST_P(ReferenceTest, MatchesReferenceAndLayoutsAreBitIdentical) {
  const auto& [c, dtype] = GetParam();
  const int64_t n = static_cast<int64_t>(c.splits.size()), t = total(c.splits);
  const Tensor x = random_tensor({t, c.in}, dtype, 11);
  const Tensor dy = random_tensor({t, c.out}, dtype, 12);

  struct Run {
    Tensor y, dx;
  };
  std::vector<std::unique_ptr<GroupedLinear>> owned;
  std::vector<Run> runs;
  for (WeightLayout layout : kLayouts) {
    owned.push_back(
        std::make_unique<GroupedLinear>(options(n, c.in, c.out, dtype, layout, c.bias)));
    Run r;
    r.y = owned.back()->forward(x, c.splits);
    r.dx = owned.back()->backward(dy);
    runs.push_back(r);
  }
  const GroupedLinear& base = *owned[0];

  // Against the reference (PerExpert; the others are bit-identical to it, checked below).
  const auto ex = reference::experts_of(base);
  const auto xd = to_double(x), dyd = to_double(dy);
  EXPECT_EQ(runs[0].y.dtype(), dtype);
  EXPECT_TRUE(close_to(runs[0].y, reference::ref_forward(xd, c.splits, ex))) << "forward";
  EXPECT_TRUE(close_to(runs[0].dx, reference::ref_dgrad(dyd, c.splits, ex))) << "dgrad";
  for (size_t e = 0; e < c.splits.size(); ++e) {
    const auto i = static_cast<int64_t>(e);
    EXPECT_TRUE(close_to(base.expert_weight_grad(i),
                         reference::ref_wgrad(xd, dyd, c.splits, e, c.in, c.out)))
        << "wgrad of expert " << e;
    if (c.bias) {
      EXPECT_TRUE(close_to(base.expert_bias_grad(i), reference::ref_bgrad(dyd, c.splits, e, c.out)))
          << "bgrad of expert " << e;
    } else {
      EXPECT_FALSE(base.expert_bias(i).defined());
      EXPECT_FALSE(base.expert_bias_grad(i).defined());
    }
  }

  // Every layout: same parameters, same outputs, same gradients, bit for bit.
  for (size_t l = 1; l < owned.size(); ++l) {
    SCOPED_TRACE(std::string(layout_name(kLayouts[l])));
    EXPECT_TRUE(runs[l].y.bit_equal(runs[0].y)) << "forward";
    EXPECT_TRUE(runs[l].dx.bit_equal(runs[0].dx)) << "dgrad";
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_TRUE(owned[l]->expert_weight(i).bit_equal(base.expert_weight(i))) << i;
      EXPECT_TRUE(owned[l]->expert_weight_grad(i).bit_equal(base.expert_weight_grad(i))) << i;
      if (!c.bias) continue;
      EXPECT_TRUE(owned[l]->expert_bias(i).bit_equal(base.expert_bias(i))) << i;
      EXPECT_TRUE(owned[l]->expert_bias_grad(i).bit_equal(base.expert_bias_grad(i))) << i;
    }
  }

  // Same inputs again: the same bits (bias gradients have no atomics, GEMMs no races).
  std::vector<Tensor> wgrads, bgrads;
  for (int64_t i = 0; i < n; ++i) {
    wgrads.push_back(base.expert_weight_grad(i).clone());
    if (c.bias) bgrads.push_back(base.expert_bias_grad(i).clone());
  }
  EXPECT_TRUE(owned[0]->forward(x, c.splits).bit_equal(runs[0].y));
  EXPECT_TRUE(owned[0]->backward(dy).bit_equal(runs[0].dx));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(base.expert_weight_grad(i).bit_equal(wgrads[static_cast<size_t>(i)])) << i;
    if (c.bias) {
      EXPECT_TRUE(base.expert_bias_grad(i).bit_equal(bgrads[static_cast<size_t>(i)])) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceTest,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// The tolerance is tight enough to notice a mis-routed, mis-offset or transposed expert.
TEST(ReferenceCheckTest, RejectsWrongExpertShiftedRowsAndTransposedWeights) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::vector<int64_t> splits = {3, 4, 2};
    GroupedLinear layer(options(3, 4, 4, dtype, WeightLayout::PerExpert));
    const Tensor x = random_tensor({9, 4}, dtype, 5);
    const Tensor y = layer.forward(x, splits);
    const auto ex = reference::experts_of(layer);
    const auto xd = to_double(x);
    ASSERT_TRUE(close_to(y, reference::ref_forward(xd, splits, ex)));
    auto rotated = ex;  // expert e computed with expert e+1's parameters
    std::rotate(rotated.w.begin(), rotated.w.begin() + 1, rotated.w.end());
    std::rotate(rotated.b.begin(), rotated.b.begin() + 1, rotated.b.end());
    EXPECT_FALSE(close_to(y, reference::ref_forward(xd, splits, rotated)));
    auto transposed = ex;
    for (size_t e = 0; e < 3; ++e) {
      for (size_t o = 0; o < 4; ++o) {
        for (size_t k = 0; k < 4; ++k) transposed.w[e][o * 4 + k] = ex.w[e][k * 4 + o];
      }
    }
    EXPECT_FALSE(close_to(y, reference::ref_forward(xd, splits, transposed)));
    const std::vector<int64_t> shifted = {4, 3, 2};  // one row moved to the wrong expert
    EXPECT_FALSE(close_to(y, reference::ref_forward(xd, shifted, ex)));
  }
}

TEST(GroupedLinearInitTest, SeedGivesBitIdenticalParametersInEveryLayout) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    GroupedLinear base(options(8, 5, 3, dtype, WeightLayout::PerExpert));
    GroupedLinear again(options(8, 5, 3, dtype, WeightLayout::PerExpert));
    for (WeightLayout layout : kLayouts) {
      GroupedLinear other(options(8, 5, 3, dtype, layout));
      for (int64_t i = 0; i < 8; ++i) {
        EXPECT_TRUE(other.expert_weight(i).bit_equal(base.expert_weight(i))) << i;
        EXPECT_TRUE(other.expert_bias(i).bit_equal(base.expert_bias(i))) << i;
        EXPECT_TRUE(again.expert_weight(i).bit_equal(base.expert_weight(i))) << i;
      }
    }
  }
}

// first_expert: a layer of experts [3, 5) of an 8-expert layer (one rank's share) holds their
// values, FP8 scales included, in every layout.
TEST(GroupedLinearInitTest, FirstExpertGivesThatSliceOfTheWholeLayer) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F8_E4M3}) {
    GroupedLinear whole(options(8, 130, 3, dtype, WeightLayout::PerExpert));
    for (WeightLayout layout : kLayouts) {
      auto o = options(2, 130, 3, dtype, layout);
      o.first_expert = 3;
      GroupedLinear part(o);
      for (int64_t i = 0; i < 2; ++i) {
        EXPECT_TRUE(part.expert_weight(i).bit_equal(whole.expert_weight(3 + i))) << i;
        EXPECT_TRUE(part.expert_bias(i).bit_equal(whole.expert_bias(3 + i))) << i;
        if (dtype == DType::F8_E4M3) {
          EXPECT_TRUE(part.expert_weight_scale(i).bit_equal(whole.expert_weight_scale(3 + i)));
        }
      }
    }
  }
}

TEST(GroupedLinearInitTest, UniformInBoundWithDistinctStreams) {
  const int64_t in = 64, out = 48;
  GroupedLinear a(options(3, in, out, DType::F32, WeightLayout::PerExpert));
  auto o = options(3, in, out, DType::F32, WeightLayout::PerExpert);
  o.seed = 1235;
  GroupedLinear b(o);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  for (int64_t i = 0; i < 3; ++i) {
    const auto w = to_double(a.expert_weight(i));
    const double lo = *std::min_element(w.begin(), w.end());
    const double hi = *std::max_element(w.begin(), w.end());
    EXPECT_GE(lo, -bound);
    EXPECT_LT(hi, bound);
    EXPECT_LT(lo, -0.9 * bound);  // 3072 draws cover the range
    EXPECT_GT(hi, 0.9 * bound);
    for (double v : to_double(a.expert_bias(i))) EXPECT_LE(std::abs(v), bound);
    EXPECT_FALSE(a.expert_weight(i).bit_equal(b.expert_weight(i))) << "seed ignored";
    EXPECT_FALSE(a.expert_weight(i).bit_equal(a.expert_weight((i + 1) % 3))) << "same stream";
    EXPECT_NE(to_double(a.expert_bias(i))[0], w[0]);
  }
}

// Experts that lose all their rows get exactly zero gradients, not the previous step's.
TEST(GroupedLinearBackwardTest, ZeroRowExpertsGetZeroGradsAfterNonzeroOnes) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (WeightLayout layout : kLayouts) {
      GroupedLinear layer(options(4, 5, 3, dtype, layout));
      layer.forward(random_tensor({8, 5}, dtype, 1), std::vector<int64_t>{2, 2, 2, 2});
      layer.backward(random_tensor({8, 3}, dtype, 2));
      const std::vector<int64_t> splits = {0, 5, 0, 3};
      layer.forward(random_tensor({8, 5}, dtype, 3), splits);
      layer.backward(random_tensor({8, 3}, dtype, 4));
      for (int64_t i : {0, 2}) {
        EXPECT_TRUE(layer.expert_weight_grad(i).bit_equal(Tensor::zeros({3, 5}, dtype))) << i;
        EXPECT_TRUE(layer.expert_bias_grad(i).bit_equal(Tensor::zeros({3}, dtype))) << i;
      }
      EXPECT_FALSE(layer.expert_weight_grad(1).bit_equal(Tensor::zeros({3, 5}, dtype)));
    }
  }
}

TEST(GroupedLinearBackwardTest, FusedWgradAccumulatesIntoMainGrad) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    std::vector<std::unique_ptr<GroupedLinear>> layers;
    for (WeightLayout layout : kLayouts) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(layout_name(layout)));
      auto o = options(4, 5, 3, dtype, layout);
      o.fuse_wgrad_accumulation = true;
      auto layer = std::make_unique<GroupedLinear>(o);
      const std::vector<int64_t> s1 = {3, 0, 2, 4}, s2 = {0, 0, 5, 4};
      const Tensor x1 = random_tensor({9, 5}, dtype, 21), dy1 = random_tensor({9, 3}, dtype, 22);
      const Tensor x2 = random_tensor({9, 5}, dtype, 23), dy2 = random_tensor({9, 3}, dtype, 24);
      layer->forward(x1, s1);
      layer->backward(dy1);
      const Tensor first0 = layer->expert_main_grad(0).clone();
      layer->forward(x2, s2);
      layer->backward(dy2);
      EXPECT_TRUE(layer->expert_main_grad(0).bit_equal(first0)) << "no rows in call 2: unchanged";
      EXPECT_TRUE(layer->expert_main_grad(1).bit_equal(Tensor::zeros({3, 5}, DType::F32)));
      for (size_t e : {size_t{2}, size_t{3}}) {
        const auto i = static_cast<int64_t>(e);
        EXPECT_EQ(layer->expert_main_grad(i).dtype(), DType::F32);
        const Ref sum =
            reference::ref_sum(reference::ref_wgrad(to_double(x1), to_double(dy1), s1, e, 5, 3),
                               reference::ref_wgrad(to_double(x2), to_double(dy2), s2, e, 5, 3));
        EXPECT_TRUE(close_to(layer->expert_main_grad(i), sum)) << "expert " << e;
        // Bias gradients are not fused: they hold the last call's gradient.
        EXPECT_TRUE(
            close_to(layer->expert_bias_grad(i), reference::ref_bgrad(to_double(dy2), s2, e, 3)));
      }
      EXPECT_TRUE(layer->expert_bias_grad(0).bit_equal(Tensor::zeros({3}, dtype)));
      layers.push_back(std::move(layer));
    }
    for (size_t l = 1; l < layers.size(); ++l) {
      for (int64_t i = 0; i < 4; ++i) {
        EXPECT_TRUE(layers[l]->expert_main_grad(i).bit_equal(layers[0]->expert_main_grad(i)));
      }
    }
  }
}

// 0.5 * sum(y^2) for the layer's output; its gradient with respect to y is y itself.
double half_square(const Tensor& y) {
  double s = 0.0;
  for (double v : to_double(y)) s += 0.5 * v * v;
  return s;
}

TEST(GroupedLinearSgdTest, StepUpdatesEveryParameterAndReducesTheLoss) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (WeightLayout layout : kLayouts) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(layout_name(layout)));
      GroupedLinear layer(options(3, 6, 4, dtype, layout));
      const std::vector<int64_t> splits = {5, 0, 7};
      const Tensor x = random_tensor({12, 6}, dtype, 31);
      double loss = half_square(layer.forward(x, splits));
      for (int step = 0; step < 3; ++step) {
        const Tensor y = layer.forward(x, splits);
        layer.backward(y);
        std::vector<std::vector<double>> before, grads;
        for (int64_t i = 0; i < 3; ++i) {
          before.push_back(to_double(layer.expert_weight(i)));
          grads.push_back(to_double(layer.expert_weight_grad(i)));
        }
        const float lr = 0.05f;
        sgd_step(layer, lr);
        for (size_t e = 0; e < 3; ++e) {
          const auto after = to_double(layer.expert_weight(static_cast<int64_t>(e)));
          for (size_t k = 0; k < after.size(); ++k) {
            const double want = before[e][k] - static_cast<double>(lr) * grads[e][k];
            // One F32 product and difference, then (BF16) one rounding of the result.
            double tol = 2.0 * std::ldexp(std::abs(before[e][k]) + std::abs(lr * grads[e][k]), -24);
            if (dtype == DType::BF16) tol += std::ldexp(std::abs(want), -8);
            ASSERT_LE(std::abs(after[k] - want), tol) << "expert " << e << " element " << k;
          }
        }
        const double next = half_square(layer.forward(x, splits));
        EXPECT_LT(next, loss) << "step " << step;
        loss = next;
      }
      // The expert without rows has zero gradients and keeps its weights.
      GroupedLinear fresh(options(3, 6, 4, dtype, layout));
      EXPECT_TRUE(layer.expert_weight(1).bit_equal(fresh.expert_weight(1)));
      EXPECT_FALSE(layer.expert_weight(0).bit_equal(fresh.expert_weight(0)));
      EXPECT_FALSE(layer.expert_bias(2).bit_equal(fresh.expert_bias(2)));
      zero_grad(layer);
      for (int64_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(layer.expert_weight_grad(i).bit_equal(Tensor::zeros({4, 6}, dtype)));
        EXPECT_TRUE(layer.expert_bias_grad(i).bit_equal(Tensor::zeros({4}, dtype)));
      }
    }
  }
}

TEST(GroupedLinearSgdTest, FusedStepUsesMainGrad) {
  auto o = options(2, 5, 3, DType::BF16, WeightLayout::Contiguous);
  o.fuse_wgrad_accumulation = true;
  GroupedLinear layer(o);
  const std::vector<int64_t> splits = {4, 2};
  const Tensor x = random_tensor({6, 5}, DType::BF16, 41);
  layer.forward(x, splits);
  layer.backward(random_tensor({6, 3}, DType::BF16, 42));
  const auto before = to_double(layer.expert_weight(1));
  const auto main_grad = to_double(layer.expert_main_grad(1));
  sgd_step(layer, 0.5f);
  const auto after = to_double(layer.expert_weight(1));
  for (size_t k = 0; k < after.size(); ++k) {
    const double want = before[k] - 0.5 * main_grad[k];
    EXPECT_LE(std::abs(after[k] - want), std::ldexp(std::abs(want), -8) + 1e-6) << k;
  }
  zero_grad(layer);
  EXPECT_TRUE(layer.expert_main_grad(1).bit_equal(Tensor::zeros({3, 5}, DType::F32)));
}

}  // namespace
}  // namespace grouplin
