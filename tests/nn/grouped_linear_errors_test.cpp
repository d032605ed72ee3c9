// GroupedLinear preconditions: every violation throws grouplin::Error with its own code and a
// message naming the argument, the expected and the actual value; a failed call changes nothing
// (parameters and gradients bit-identical, the previous forward's saved input still usable).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

constexpr int64_t kN = 3, kIn = 5, kOut = 3, kT = 6;
const std::vector<int64_t> kSplits = {2, 0, 4};

using testing::kLayouts;

GroupedLinearOptions options(WeightLayout layout, DType dtype = DType::F32) {
  return testing::gl_options(kN, layout, /*seed=*/99, /*bias=*/true, dtype, kIn, kOut);
}

Tensor ramp(const Shape& shape, float scale, DType dtype = DType::F32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
  return Tensor::from_f32(shape, v, dtype);
}

// Runs f, which must throw Error(code) whose message contains every needle.
void expect_error(const std::function<void()>& f, ErrorCode code,
                  const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected " << error_code_name(code) << ", nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(error_code_name(e.code()), error_code_name(code)) << e.what();
    for (const std::string& n : needles) {
      EXPECT_NE(e.message().find(n), std::string::npos) << "\"" << n << "\" not in: " << e.what();
    }
  }
}

// Copies of everything a call could change: parameter values, grads and main grads.
std::vector<Tensor> snapshot(const GroupedLinear& layer) {
  std::vector<Tensor> s;
  for (const Parameter& p : layer.parameters()) {
    s.push_back(p.value.clone());
    s.push_back(p.grad.defined() ? p.grad.clone() : Tensor());
    s.push_back(p.main_grad.defined() ? p.main_grad.clone() : Tensor());
  }
  return s;
}

void expect_unchanged(const GroupedLinear& layer, const std::vector<Tensor>& before) {
  const std::vector<Tensor> now = snapshot(layer);
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_EQ(now[i].defined(), before[i].defined()) << "slot " << i;
    if (now[i].defined() && before[i].defined()) {
      EXPECT_TRUE(now[i].bit_equal(before[i])) << "slot " << i;
    }
  }
}

struct ForwardCase {
  std::string name;
  Tensor x;
  std::vector<int64_t> splits;
  ErrorCode code;
  std::vector<std::string> needles;
};

std::vector<ForwardCase> forward_cases() {
  const Tensor x = ramp({kT, kIn}, 0.25f);
  const int64_t big = std::numeric_limits<int64_t>::max();
  return {
      {"too_few_splits", x, {2, 4}, ErrorCode::SplitCountMismatch, {"m_splits", "2", "3"}},
      {"too_many_splits", x, {2, 0, 4, 0}, ErrorCode::SplitCountMismatch, {"m_splits", "4", "3"}},
      {"no_splits", x, {}, ErrorCode::SplitCountMismatch, {"m_splits", "0", "3"}},
      {"negative_split", x, {3, -1, 4}, ErrorCode::NegativeSplit, {"m_splits[1]", "-1", ">= 0"}},
      // Regression: a negative entry after one that overshoots T was reported as a sum
      // mismatch "sum to 6, expected T = 6"; it is a negative split.
      {"negative_after_overshoot", x, {7, -1, 0}, ErrorCode::NegativeSplit, {"m_splits[1]", "-1"}},
      {"sum_too_small", x, {2, 0, 3}, ErrorCode::SplitSumMismatch, {"m_splits", "5", "T = 6"}},
      {"sum_too_large", x, {2, 1, 4}, ErrorCode::SplitSumMismatch, {"m_splits", "7", "T = 6"}},
      {"sum_overflows", x, {big, big, 2}, ErrorCode::SplitSumMismatch, {"m_splits", "2^63", "6"}},
      {"wrong_in_features",
       ramp({kT, 4}, 1.0f),
       kSplits,
       ErrorCode::ShapeMismatch,
       {"x", "[6, 4]", "5"}},
      {"rank_one_x",
       ramp({kT * kIn}, 1.0f),
       kSplits,
       ErrorCode::ShapeMismatch,
       {"x", "[30]", "[T, 5]"}},
      {"rank_three_x",
       ramp({1, kT, kIn}, 1.0f),
       kSplits,
       ErrorCode::ShapeMismatch,
       {"x", "[1, 6, 5]"}},
      {"wrong_dtype",
       ramp({kT, kIn}, 1.0f, DType::BF16),
       kSplits,
       ErrorCode::DTypeMismatch,
       {"x", "BF16", "F32"}},
      {"undefined_x", Tensor(), kSplits, ErrorCode::UndefinedTensor, {"x"}},
  };
}

// After any failed forward: the module is unchanged and the previous forward's saved input and
// splits still drive backward, with the same results as a twin that never saw the failure.
TEST(GroupedLinearErrorsTest, FailedForwardThrowsAndChangesNothing) {
  for (WeightLayout layout : kLayouts) {
    for (const ForwardCase& c : forward_cases()) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " " + c.name);
      GroupedLinear layer(options(layout)), twin(options(layout));
      const Tensor x = ramp({kT, kIn}, 0.5f), dy = ramp({kT, kOut}, 0.125f);
      layer.forward(x, kSplits);
      layer.backward(dy);
      twin.forward(x, kSplits);
      const std::vector<Tensor> before = snapshot(layer);
      expect_error([&] { layer.forward(c.x, c.splits); }, c.code, c.needles);
      expect_unchanged(layer, before);
      const Tensor dx = layer.backward(ramp({kT, kOut}, -0.5f));
      const Tensor twin_dx = twin.backward(ramp({kT, kOut}, -0.5f));
      EXPECT_TRUE(dx.bit_equal(twin_dx));
      for (int64_t i = 0; i < kN; ++i) {
        EXPECT_TRUE(layer.expert_weight_grad(i).bit_equal(twin.expert_weight_grad(i))) << i;
        EXPECT_TRUE(layer.expert_bias_grad(i).bit_equal(twin.expert_bias_grad(i))) << i;
      }
    }
  }
}

TEST(GroupedLinearErrorsTest, BackwardBeforeForward) {
  for (WeightLayout layout : kLayouts) {
    GroupedLinear layer(options(layout));
    const std::vector<Tensor> before = snapshot(layer);
    expect_error(
        [&] {
          layer.backward(ramp({kT, kOut}, 1.0f));
        },
        ErrorCode::BackwardBeforeForward, {"backward", "forward"});
    expect_unchanged(layer, before);  // grads still undefined
    // A failed first forward saves nothing either.
    expect_error(
        [&] {
          layer.forward(ramp({kT, kIn}, 1.0f), std::vector<int64_t>{1, 1});
        },
        ErrorCode::SplitCountMismatch, {"m_splits"});
    expect_error(
        [&] {
          layer.backward(ramp({kT, kOut}, 1.0f));
        },
        ErrorCode::BackwardBeforeForward, {"backward"});
  }
}

TEST(GroupedLinearErrorsTest, FailedBackwardThrowsAndLeavesGradsUnchanged) {
  struct Case {
    std::string name;
    Tensor dy;
    ErrorCode code;
    std::vector<std::string> needles;
  };
  const std::vector<Case> bad = {
      {"too_few_rows",
       ramp({kT - 1, kOut}, 1.0f),
       ErrorCode::ShapeMismatch,
       {"dy", "[5, 3]", "[6, 3]"}},
      {"too_many_rows",
       ramp({kT + 1, kOut}, 1.0f),
       ErrorCode::ShapeMismatch,
       {"dy", "[7, 3]", "[6, 3]"}},
      {"wrong_out_features",
       ramp({kT, kIn}, 1.0f),
       ErrorCode::ShapeMismatch,
       {"dy", "[6, 5]", "[6, 3]"}},
      {"rank_one", ramp({kT * kOut}, 1.0f), ErrorCode::ShapeMismatch, {"dy", "[18]", "[6, 3]"}},
      {"rank_three", ramp({1, kT, kOut}, 1.0f), ErrorCode::ShapeMismatch, {"dy", "[1, 6, 3]"}},
      {"undefined", Tensor(), ErrorCode::ShapeMismatch, {"dy", "[6, 3]"}},
      {"wrong_dtype",
       ramp({kT, kOut}, 1.0f, DType::BF16),
       ErrorCode::DTypeMismatch,
       {"dy", "BF16", "F32"}},
  };
  for (WeightLayout layout : kLayouts) {
    for (bool fused : {false, true}) {
      for (bool after_first_backward : {false, true}) {
        auto o = options(layout);
        o.fuse_wgrad_accumulation = fused;
        GroupedLinear layer(o);
        layer.forward(ramp({kT, kIn}, 0.5f), kSplits);
        if (after_first_backward) layer.backward(ramp({kT, kOut}, 0.25f));
        const std::vector<Tensor> before = snapshot(layer);
        for (const Case& c : bad) {
          SCOPED_TRACE(std::string(layout_name(layout)) + (fused ? " fused " : " ") + c.name);
          expect_error([&] { layer.backward(c.dy); }, c.code, c.needles);
          expect_unchanged(layer, before);
        }
        // The saved input survived every failure.
        EXPECT_EQ(layer.backward(ramp({kT, kOut}, 0.25f)).shape(), (Shape{kT, kIn}));
      }
    }
  }
}

TEST(GroupedLinearErrorsTest, BF16ModuleRejectsF32Tensors) {
  GroupedLinear layer(options(WeightLayout::Single, DType::BF16));
  expect_error(
      [&] {
        layer.forward(ramp({kT, kIn}, 1.0f), kSplits);
      },
      ErrorCode::DTypeMismatch, {"x", "F32", "BF16"});
  layer.forward(ramp({kT, kIn}, 1.0f, DType::BF16), kSplits);
  expect_error(
      [&] {
        layer.backward(ramp({kT, kOut}, 1.0f));
      },
      ErrorCode::DTypeMismatch, {"dy", "F32", "BF16"});
}

TEST(GroupedLinearErrorsTest, InvalidOptions) {
  struct Case {
    std::string name;
    std::function<void(GroupedLinearOptions&)> edit;
    ErrorCode code;
    std::vector<std::string> needles;
  };
  const std::vector<Case> bad = {
      {"zero_gemms",
       [](auto& o) { o.num_gemms = 0; },
       ErrorCode::InvalidArgument,
       {"num_gemms", "0", ">= 1"}},
      {"negative_gemms",
       [](auto& o) { o.num_gemms = -2; },
       ErrorCode::InvalidArgument,
       {"num_gemms", "-2"}},
      {"zero_in",
       [](auto& o) { o.in_features = 0; },
       ErrorCode::InvalidArgument,
       {"in_features", "0"}},
      {"negative_out",
       [](auto& o) { o.out_features = -1; },
       ErrorCode::InvalidArgument,
       {"out_features", "-1"}},
      {"negative_first_expert",
       [](auto& o) { o.first_expert = -3; },
       ErrorCode::InvalidArgument,
       {"first_expert", "-3", ">= 0"}},
      {"f16_params",
       [](auto& o) { o.params_dtype = DType::F16; },
       ErrorCode::UnsupportedDType,
       {"params_dtype", "F16", "F32, BF16 or F8_E4M3"}},
      {"i32_params",
       [](auto& o) { o.params_dtype = DType::I32; },
       ErrorCode::UnsupportedDType,
       {"params_dtype", "I32"}},
      {"activations_other_than_params",
       [](auto& o) { o.activation_dtype = DType::BF16; },
       ErrorCode::UnsupportedDType,
       {"activation_dtype is BF16", "expected F32 (params_dtype)"}},
      {"fp8_f16_activations",
       [](auto& o) {
         o.params_dtype = DType::F8_E4M3;
         o.activation_dtype = DType::F16;
       },
       ErrorCode::UnsupportedDType,
       {"activation_dtype is F16", "F32 or BF16 beside F8_E4M3 weights"}},
      {"fp8_wgrad_accumulation",
       [](auto& o) {
         o.params_dtype = DType::F8_E4M3;
         o.fuse_wgrad_accumulation = true;
       },
       ErrorCode::Fp8WeightsNotTrainable,
       {"fuse_wgrad_accumulation", "no gradient"}},
  };
  for (WeightLayout layout : kLayouts) {
    for (const Case& c : bad) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " " + c.name);
      GroupedLinearOptions o = options(layout);
      c.edit(o);
      expect_error([&] { GroupedLinear layer(o); }, c.code, c.needles);
    }
  }
}

TEST(GroupedLinearErrorsTest, ExpertIndexIsChecked) {
  for (WeightLayout layout : kLayouts) {
    GroupedLinear layer(options(layout));
    for (int64_t i : {int64_t{-1}, kN}) {
      const std::string s = std::to_string(i);
      expect_error([&] { layer.expert_weight(i); }, ErrorCode::OutOfBounds, {s, "0..2"});
      expect_error([&] { layer.expert_bias(i); }, ErrorCode::OutOfBounds, {s});
      expect_error([&] { layer.expert_weight_grad(i); }, ErrorCode::OutOfBounds, {s});
      expect_error([&] { layer.expert_bias_grad(i); }, ErrorCode::OutOfBounds, {s});
      expect_error([&] { layer.expert_main_grad(i); }, ErrorCode::OutOfBounds, {s});
    }
  }
}

}  // namespace
}  // namespace grouplin
