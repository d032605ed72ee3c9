// The stateless grouped GEMM: GroupedLinear's bits from explicit inputs, several forwards in flight
// before their backwards, every bad argument named.
#include "grouplin/grouped_gemm.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "error_of.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/storage.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::error_of;

using testing::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::equal(a.data(), a.data() + a.nbytes(), b.data());
}

// The layer's experts, as the stateless calls take them.
ExpertWeights weights_of(const GroupedLinear& layer) {
  ExpertWeights w;
  for (int64_t i = 0; i < layer.num_gemms(); ++i) {
    w.weights.push_back(layer.expert_weight(i));
    w.biases.push_back(layer.expert_bias(i));
  }
  return w;
}

TEST(GroupedGemm, GivesGroupedLinearsBitsWithSeveralForwardsInFlight) {
  const std::vector<int64_t> splits = {5, 0, 17, 3}, other = {1, 9, 0, 2};
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    GroupedLinear layer(testing::gl_options(4, WeightLayout::PerExpert, 77, true, dtype, 24, 40));
    const ExpertWeights w = weights_of(layer);
    const Tensor x = random_tensor({25, 24}, dtype, 1), dy = random_tensor({25, 40}, dtype, 2);
    const Tensor x2 = random_tensor({12, 24}, dtype, 3);

    // Two forwards, then the first one's backward: nothing of the second is mixed in.
    const Tensor y = grouped_linear_forward(x, splits, w);
    const Tensor y2 = grouped_linear_forward(x2, other, w);
    const GroupedGrads g = grouped_linear_backward(x, dy, splits, w);

    EXPECT_TRUE(same_bits(y, layer.forward(x, splits)));
    const Tensor dx = layer.backward(dy);
    EXPECT_TRUE(same_bits(g.dx, dx));
    ASSERT_EQ(g.dw.shape(), (Shape{4, 40, 24}));
    ASSERT_EQ(g.db.shape(), (Shape{4, 40}));
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(same_bits(g.dw.select(i), layer.expert_weight_grad(i))) << i;
      EXPECT_TRUE(same_bits(g.db.select(i), layer.expert_bias_grad(i))) << i;
    }
    EXPECT_TRUE(same_bits(y2, layer.forward(x2, other)));

    // Stacked views give the same, and only what was asked for is computed.
    GroupedLinear single(testing::gl_options(4, WeightLayout::Single, 77, true, dtype, 24, 40));
    const ExpertWeights s = ExpertWeights::stacked(single.parameters()[0].value, Tensor(),
                                                   single.parameters()[1].value);
    EXPECT_TRUE(same_bits(grouped_linear_forward(x, splits, s), y));
    const GroupedGrads only_dx =
        grouped_linear_backward(x, dy, splits, s, {.dw = false, .db = false});
    EXPECT_TRUE(same_bits(only_dx.dx, g.dx));
    EXPECT_FALSE(only_dx.dw.defined());
    EXPECT_FALSE(only_dx.db.defined());
  }
}

// Outputs are written whole, whatever their memory held: large outputs take memory that freed
// storages of their size leave behind (Storage), here filled with NaN first. Every forward,
// dgrad and wgrad path (rows per expert 1 to 1800, F32 and BF16) gives the bits it gives on fresh
// memory.
TEST(GroupedGemm, OutputsOnReusedMemoryAreWrittenWhole) {
  const std::vector<int64_t> splits = {1, 2, 3, 4, 5, 6, 8, 12, 17, 33, 64, 100, 0, 7, 1800};
  int64_t t = 0;
  for (int64_t m : splits) t += m;
  const auto n = static_cast<int64_t>(splits.size());
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor w = random_tensor({n, 528, 520}, dtype, 7);
    const Tensor x = random_tensor({t, 520}, dtype, 8), dy = random_tensor({t, 528}, dtype, 9);
    const ExpertWeights e = ExpertWeights::stacked(w);
    Storage::release_kept_memory();
    const Tensor y = grouped_linear_forward(x, splits, e);
    const GroupedGrads g = grouped_linear_backward(x, dy, splits, e, {.db = false});
    for (const Tensor* like : {&y, &g.dx, &g.dw}) {
      ASSERT_GE(like->nbytes(), size_t{2} << 20);  // large enough to be kept
    }
    // Poison memory of each output's size, free it, and compute again into it.
    auto poisoned = [&](const Tensor& like) {
      Tensor p = Tensor::empty(like.shape(), like.dtype());
      std::memset(p.mutable_data(), 0xff, p.nbytes());  // NaN in F32 and BF16
      return p.data();
    };
    const std::byte* at_y = poisoned(y);
    const Tensor y2 = grouped_linear_forward(x, splits, e);
    EXPECT_EQ(y2.data(), at_y);
    EXPECT_TRUE(same_bits(y2, y));
    const std::byte* at_dx = poisoned(g.dx);
    const Tensor dx2 = grouped_linear_backward(x, dy, splits, e, {.dw = false, .db = false}).dx;
    EXPECT_EQ(dx2.data(), at_dx);
    EXPECT_TRUE(same_bits(dx2, g.dx));
    const std::byte* at_dw = poisoned(g.dw);
    const Tensor dw2 = grouped_linear_backward(x, dy, splits, e, {.dx = false, .db = false}).dw;
    EXPECT_EQ(dw2.data(), at_dw);
    EXPECT_TRUE(same_bits(dw2, g.dw));
  }
}

TEST(GroupedGemm, EveryBadArgumentIsNamed) {
  GroupedLinear layer(testing::gl_options(3, WeightLayout::PerExpert, 5, true, DType::F32, 8, 6));
  const ExpertWeights w = weights_of(layer);
  const Tensor x = random_tensor({4, 8}, DType::F32, 1);
  const std::vector<int64_t> splits = {1, 2, 1};
  auto forward_error = [&](const Tensor& in, std::vector<int64_t> m, const ExpertWeights& e) {
    return error_of([&] { grouped_linear_forward(in, m, e); });
  };
  EXPECT_EQ(forward_error(x, {1, 3}, w).code(), ErrorCode::SplitCountMismatch);
  EXPECT_EQ(forward_error(x, {1, -1, 4}, w).code(), ErrorCode::NegativeSplit);
  EXPECT_EQ(forward_error(x, {1, 1, 1}, w).code(), ErrorCode::SplitSumMismatch);
  const Error shape = forward_error(random_tensor({4, 7}, DType::F32, 1), splits, w);
  EXPECT_EQ(shape.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(
      std::string(shape.what()).find("grouped_linear_forward: x has shape [4, 7], expected [T, 8]"),
      std::string::npos)
      << shape.what();
  EXPECT_EQ(forward_error(random_tensor({4, 8}, DType::BF16, 1), splits, w).code(),
            ErrorCode::DTypeMismatch);
  EXPECT_EQ(forward_error(Tensor(), splits, w).code(), ErrorCode::UndefinedTensor);
  ExpertWeights odd = w;
  odd.weights[2] = random_tensor({6, 9}, DType::F32, 4);
  const Error weight = forward_error(x, splits, odd);
  EXPECT_EQ(weight.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(std::string(weight.what()).find("weights[2]"), std::string::npos) << weight.what();
  odd = w;
  odd.biases.pop_back();
  EXPECT_EQ(forward_error(x, splits, odd).code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(forward_error(x, splits, ExpertWeights{}).code(), ErrorCode::InvalidArgument);

  Tensor y = Tensor::zeros({4, 6}, DType::F32);
  Tensor alias = x;  // y viewing x's bytes
  EXPECT_EQ(error_of([&] { grouped_linear_forward(x, splits, w, alias); }).code(),
            ErrorCode::ShapeMismatch);
  EXPECT_NO_THROW(grouped_linear_forward(x, splits, w, y));
  EXPECT_EQ(error_of([&] {
              grouped_linear_backward(x, random_tensor({4, 5}, DType::F32, 2), splits, w);
            }).code(),
            ErrorCode::ShapeMismatch);

  // FP8 weights: no weight gradient.
  GroupedLinearOptions o =
      testing::gl_options(3, WeightLayout::PerExpert, 5, false, DType::F8_E4M3, 8, 6);
  GroupedLinear fp8(o);
  ExpertWeights f;
  for (int64_t i = 0; i < 3; ++i) {
    f.weights.push_back(fp8.expert_weight(i));
    f.scales.push_back(fp8.expert_weight_scale(i));
  }
  const Tensor xb = random_tensor({4, 8}, DType::BF16, 1),
               dyb = random_tensor({4, 6}, DType::BF16, 2);
  EXPECT_TRUE(same_bits(grouped_linear_forward(xb, splits, f), fp8.forward(xb, splits)));
  EXPECT_EQ(error_of([&] { grouped_linear_backward(xb, dyb, splits, f); }).code(),
            ErrorCode::Fp8WeightsNotTrainable);
  EXPECT_TRUE(
      same_bits(grouped_linear_backward(xb, dyb, splits, f, {.dw = false}).dx, fp8.backward(dyb)));
  f.scales.pop_back();
  EXPECT_EQ(forward_error(xb, splits, f).code(), ErrorCode::InvalidArgument);
}

}  // namespace
}  // namespace grouplin
