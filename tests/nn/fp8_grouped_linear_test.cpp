// GroupedLinear with FP8 weights (F8_E4M3 codes, one F32 scale per 128 x 128 block): the same
// results as F32 weights holding the dequantized values, in every layout; codes and scales kept
// byte for byte through state_dict and load_state_dict; no weight gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "error_of.hpp"
#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module.hpp"
#include "kernels/grouped_gemm.hpp"
#include "kernels/micro_kernels.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::kLayouts;
using testing::test_tensor;

// Features off the 128 grid: the last blocks of both dims are partial.
constexpr int64_t kN = 4, kIn = 200, kOut = 150;
const std::vector<int64_t> kSplits = {3, 0, 1, 9};  // dot tiles, an empty expert, packed tiles

GroupedLinearOptions fp8_options(WeightLayout layout, DType activations) {
  GroupedLinearOptions o = testing::gl_options(kN, layout, 7, true, DType::F8_E4M3, kIn, kOut);
  o.activation_dtype = activations;
  return o;
}

using testing::error_of;

TEST(Fp8GroupedLinear, NamesItsScalesAsTransformerEngineDoes) {
  GroupedLinear per(fp8_options(WeightLayout::PerExpert, DType::BF16));
  EXPECT_EQ(per.activation_dtype(), DType::BF16);
  const StateDict sd = per.state_dict();
  ASSERT_NE(sd.find("weight3_scale_inv"), nullptr);
  EXPECT_EQ(sd.at("weight3").dtype(), DType::F8_E4M3);
  EXPECT_EQ(sd.at("weight3_scale_inv").shape(), (Shape{2, 2}));
  EXPECT_EQ(sd.at("bias3").dtype(), DType::BF16);
  GroupedLinear single(fp8_options(WeightLayout::Single, DType::F32));
  EXPECT_EQ(single.state_dict().at("weight_scale_inv").shape(), (Shape{kN, 2, 2}));
  EXPECT_EQ(single.state_dict().at("bias").dtype(), DType::F32);
  EXPECT_FALSE(GroupedLinear(testing::gl_options(kN, WeightLayout::PerExpert, 7))
                   .expert_weight_scale(0)
                   .defined());
}

// The weights are the F32 module's draws quantized per block: the largest magnitude of each
// block is code 448 (or -448) times its scale, and every value is within E4M3's rounding of the
// draw.
TEST(Fp8GroupedLinear, WeightsAreTheDrawsQuantizedPerBlock) {
  GroupedLinear fp8(fp8_options(WeightLayout::PerExpert, DType::F32));
  GroupedLinear f32(
      testing::gl_options(kN, WeightLayout::PerExpert, 7, true, DType::F32, kIn, kOut));
  for (int64_t e = 0; e < kN; ++e) {
    const Tensor codes = fp8.expert_weight(e), scales = fp8.expert_weight_scale(e);
    const Tensor draws = f32.expert_weight(e);
    const auto* q = reinterpret_cast<const uint8_t*>(codes.data());
    const auto* s = scales.data_as<float>();
    const auto* w = draws.data_as<float>();
    for (int64_t br = 0; br < 2; ++br) {
      for (int64_t bc = 0; bc < 2; ++bc) {
        float amax = 0, code_max = 0;
        for (int64_t r = br * 128; r < std::min<int64_t>(kOut, (br + 1) * 128); ++r) {
          for (int64_t c = bc * 128; c < std::min<int64_t>(kIn, (bc + 1) * 128); ++c) {
            amax = std::max(amax, std::fabs(w[r * kIn + c]));
            code_max = std::max(code_max, std::fabs(f8e4m3_to_f32(q[r * kIn + c])));
            const float v = f8e4m3_to_f32(q[r * kIn + c]) * s[br * 2 + bc];
            ASSERT_LE(std::fabs(v - w[r * kIn + c]),
                      std::fabs(w[r * kIn + c]) / 16 + s[br * 2 + bc])
                << "expert " << e << " [" << r << ", " << c << "]";
          }
        }
        EXPECT_EQ(s[br * 2 + bc], amax / 448.0f);
        EXPECT_EQ(code_max, 448.0f);
      }
    }
  }
}

// Forward and dx equal those of F32 weights holding the dequantized values, bit for bit, in every
// layout: with F32 activations, an F32 module loaded from the FP8 module's state dict (which
// dequantizes: code x scale in F32); with BF16 ones, the grouped GEMM on those F32 weights and the
// BF16 activations (no module holds that mix), except forward and dx on a kernel set that sums
// them block by block (the FP8 pair kernels: dot_tile_fp8_pairs, fma_rows_fp8_pairs and
// pair_tile_scaled, tested against their models in the kernel tests): there they equal the grouped
// GEMMs on the module's codes and scales. The layouts agree.
TEST(Fp8GroupedLinear, ComputesAsItsDequantizedWeights) {
  for (DType act : {DType::F32, DType::BF16}) {
    Tensor first_y;
    for (WeightLayout layout : kLayouts) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " " + std::string(dtype_name(act)));
      GroupedLinear fp8(fp8_options(layout, act));
      GroupedLinear twin(testing::gl_options(kN, layout, 1, false, DType::F32, kIn, kOut));
      const LoadReport report = twin.load_state_dict(fp8.state_dict(), {.strict = false});
      ASSERT_FALSE(report.dtype_conversions.empty());
      std::vector<Tensor> weights, biases;
      for (int64_t e = 0; e < kN; ++e) {
        weights.push_back(twin.expert_weight(e));
        biases.push_back(fp8.expert_bias(e));
      }
      const Tensor x = test_tensor({13, kIn}, 3, act), dy = test_tensor({13, kOut}, 4, act);
      Tensor y_want = Tensor::zeros({13, kOut}, act), dx_want = Tensor::zeros({13, kIn}, act);
      kernels::grouped_forward(x, kSplits, weights, {}, biases, y_want);
      kernels::grouped_dgrad(dy, kSplits, weights, {}, dx_want);
      const kernels::MicroKernels& set = kernels::micro_kernels();
      if (act == DType::BF16 &&
          (set.dot_tile_fp8_pairs != nullptr || set.fma_rows_fp8_pairs != nullptr)) {
        std::vector<Tensor> codes, scales;
        for (int64_t e = 0; e < kN; ++e) {
          codes.push_back(fp8.expert_weight(e));
          scales.push_back(fp8.expert_weight_scale(e));
        }
        if (set.dot_tile_fp8_pairs != nullptr) {
          kernels::grouped_forward(x, kSplits, codes, scales, biases, y_want);
        }
        if (set.fma_rows_fp8_pairs != nullptr) {
          kernels::grouped_dgrad(dy, kSplits, codes, scales, dx_want);
        }
      }
      const Tensor y = fp8.forward(x, kSplits);
      EXPECT_TRUE(y.bit_equal(y_want)) << "forward";
      EXPECT_TRUE(fp8.backward(dy).bit_equal(dx_want)) << "dx";
      if (act == DType::F32) {
        GroupedLinear f32(testing::gl_options(kN, layout, 1, true, DType::F32, kIn, kOut));
        f32.load_state_dict(fp8.state_dict());
        EXPECT_TRUE(y.bit_equal(f32.forward(x, kSplits))) << "the F32 module";
      }
      if (!first_y.defined()) first_y = y;
      EXPECT_TRUE(y.bit_equal(first_y)) << "layouts differ";
    }
  }
}

// An FP8 module loads another's codes and scales byte for byte, from either layout into any.
TEST(Fp8GroupedLinear, LoadsCodesAndScalesFromEitherLayout) {
  for (WeightLayout from : {WeightLayout::PerExpert, WeightLayout::Single}) {
    GroupedLinear src(fp8_options(from, DType::BF16));
    for (WeightLayout to : kLayouts) {
      SCOPED_TRACE(std::string(layout_name(from)) + " into " + std::string(layout_name(to)));
      GroupedLinearOptions o = fp8_options(to, DType::BF16);
      o.seed = 8;  // other values, all to be replaced
      GroupedLinear dst(o);
      const LoadReport report = dst.load_state_dict(src.state_dict(), {.strict = true});
      EXPECT_TRUE(report.dtype_conversions.empty());
      for (int64_t e = 0; e < kN; ++e) {
        EXPECT_TRUE(dst.expert_weight(e).bit_equal(src.expert_weight(e))) << e;
        EXPECT_TRUE(dst.expert_weight_scale(e).bit_equal(src.expert_weight_scale(e))) << e;
        EXPECT_TRUE(dst.expert_bias(e).bit_equal(src.expert_bias(e))) << e;
      }
    }
  }
}

// A transformers FP8 checkpoint (DeepSeek-V3's form: F8_E4M3 codes with 128 x 128 block scales),
// fused or as module lists, loads into FP8 GroupedLinears as the codes and scales it holds: the
// planner hands each module its two entries, nothing is dequantized and requantized.
TEST(Fp8GroupedLinear, LoadsATransformersCheckpointAsCodesAndScales) {
  constexpr int64_t n = 2, hidden = 256, inter = 128;  // gate and up end on a block boundary
  auto fp8 = [&](WeightLayout l, int64_t in, int64_t out, uint64_t seed) {
    GroupedLinearOptions o = testing::gl_options(n, l, seed, false, DType::F8_E4M3, in, out);
    o.activation_dtype = DType::BF16;
    return std::make_shared<GroupedLinear>(o);
  };
  const auto gate_up = fp8(WeightLayout::Single, hidden, 2 * inter, 1);
  const auto down = fp8(WeightLayout::Single, inter, hidden, 2);
  const std::string p = "model.layers.0.mlp.experts.";
  StateDict fused;
  fused.insert(p + "gate_up_proj", gate_up->state_dict().at("weight"));
  fused.insert(p + "gate_up_proj_scale_inv", gate_up->state_dict().at("weight_scale_inv"));
  fused.insert(p + "down_proj", down->state_dict().at("weight"));
  fused.insert(p + "down_proj_scale_inv", down->state_dict().at("weight_scale_inv"));
  StateDict lists;
  for (int64_t e = 0; e < n; ++e) {
    const std::string q = p + std::to_string(e) + ".";
    const Tensor w = gate_up->expert_weight(e), s = gate_up->expert_weight_scale(e);
    lists.insert(q + "gate_proj.weight", w.rows(0, inter));
    lists.insert(q + "gate_proj.weight_scale_inv", s.rows(0, 1));
    lists.insert(q + "up_proj.weight", w.rows(inter, inter));
    lists.insert(q + "up_proj.weight_scale_inv", s.rows(1, 1));
    lists.insert(q + "down_proj.weight", down->expert_weight(e));
    lists.insert(q + "down_proj.weight_scale_inv", down->expert_weight_scale(e));
  }
  for (const StateDict* sd : {&fused, &lists}) {
    for (WeightLayout l : kLayouts) {
      SCOPED_TRACE(std::string(sd == &fused ? "fused" : "module lists") + " into " +
                   std::string(layout_name(l)));
      Sequential root;
      const auto gu = fp8(l, hidden, 2 * inter, 3), dn = fp8(l, inter, hidden, 4);
      root.add_child("gate_up_proj", gu);
      root.add_child("down_proj", dn);
      const LoadReport r = root.load_state_dict(*sd, {.prefix = p});
      EXPECT_TRUE(r.dtype_conversions.empty());
      EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
      // Report keys are the source's; a module list's gathered experts, the fused name.
      std::vector<std::string> loaded = r.loaded, keys = fused.keys();
      std::sort(loaded.begin(), loaded.end());
      std::sort(keys.begin(), keys.end());
      EXPECT_EQ(loaded, keys);
      for (int64_t e = 0; e < n; ++e) {
        EXPECT_TRUE(gu->expert_weight(e).bit_equal(gate_up->expert_weight(e))) << e;
        EXPECT_TRUE(gu->expert_weight_scale(e).bit_equal(gate_up->expert_weight_scale(e))) << e;
        EXPECT_TRUE(dn->expert_weight(e).bit_equal(down->expert_weight(e))) << e;
        EXPECT_TRUE(dn->expert_weight_scale(e).bit_equal(down->expert_weight_scale(e))) << e;
      }
    }
  }
}

TEST(Fp8GroupedLinear, RefusesValuesCodesWithoutScalesAndWeightGradients) {
  GroupedLinear fp8(fp8_options(WeightLayout::PerExpert, DType::BF16));
  // Values: GroupLin does not quantize a checkpoint.
  GroupedLinear bf16(
      testing::gl_options(kN, WeightLayout::PerExpert, 7, true, DType::BF16, kIn, kOut));
  Error e = error_of([&] { fp8.load_state_dict(bf16.state_dict()); });
  EXPECT_EQ(e.code(), ErrorCode::UnsupportedConversion) << e.what();
  EXPECT_NE(e.message().find("\"weight0\" holds BF16 values, which GroupLin does not quantize"),
            std::string::npos)
      << e.what();
  // Codes without their scales.
  StateDict codes_only;
  for (const auto& [name, t] : fp8.state_dict()) {
    if (name != "weight2_scale_inv") codes_only.insert(name, t);
  }
  e = error_of([&] { fp8.load_state_dict(codes_only); });
  EXPECT_EQ(e.code(), ErrorCode::Fp8ScalesNotApplied) << e.what();
  EXPECT_NE(e.message().find("\"weight2\" is F8_E4M3 codes without \"weight2_scale_inv\""),
            std::string::npos)
      << e.what();
  // No weight gradient; dx and the bias gradients are there.
  const Tensor x = test_tensor({13, kIn}, 3, DType::BF16);
  fp8.forward(x, kSplits);
  fp8.backward(test_tensor({13, kOut}, 4, DType::BF16));
  EXPECT_TRUE(fp8.expert_bias_grad(0).defined());
  EXPECT_EQ(error_of([&] { fp8.expert_weight_grad(0); }).code(), ErrorCode::Fp8WeightsNotTrainable);
  EXPECT_EQ(error_of([&] { fp8.forward(x.to(DType::F32), kSplits); }).code(),
            ErrorCode::DTypeMismatch);
}

}  // namespace
}  // namespace grouplin
