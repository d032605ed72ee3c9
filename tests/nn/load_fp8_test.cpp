// FP8 weights with their scales beside them load into F32 and BF16 GroupedLinears as their
// values: each code decoded to F32, times its block's scale in F32, rounded once into the
// parameter's dtype, whatever the checkpoint's layout (TE's weight{i} and weight, MX and
// per-tensor scales) and the module's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"
#include "io/moe_checkpoint.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

constexpr int64_t kN = 3, kOut = 40, kIn = 64;

// Expert e's FP8 codes (every pattern but NaN) and its scales for `block` ({} per tensor).
struct Fp8Expert {
  Tensor codes;   // [out, in] F8_E4M3
  Tensor scales;  // [1] or [ceil(out / r), ceil(in / c)], F32 or F8_E8M0 (MX)
};

Fp8Expert make_expert(int64_t e, const std::vector<int64_t>& block, DType scale_dtype) {
  Fp8Expert x{Tensor::zeros({kOut, kIn}, DType::F8_E4M3), {}};
  auto* codes = reinterpret_cast<uint8_t*>(x.codes.mutable_data());
  for (int64_t i = 0; i < kOut * kIn; ++i) {
    const auto c = static_cast<uint8_t>((i * 7 + e * 13) % 256);
    codes[i] = (c & 0x7f) == 0x7f ? 0x3f : c;  // no NaN
  }
  const Shape s = block.empty()
                      ? Shape{1}
                      : Shape{(kOut + block[0] - 1) / block[0], (kIn + block[1] - 1) / block[1]};
  x.scales = Tensor::zeros(s, scale_dtype);
  for (int64_t i = 0; i < x.scales.numel(); ++i) {
    if (scale_dtype == DType::F8_E8M0) {
      reinterpret_cast<uint8_t*>(x.scales.mutable_data())[i] =
          static_cast<uint8_t>(120 + (i + e) % 9);
    } else {
      reinterpret_cast<float*>(x.scales.mutable_data())[i] =
          0.01f * static_cast<float>(i + 3 * e + 1);
    }
  }
  return x;
}

// The value rule, element by element.
float value(const Fp8Expert& x, const std::vector<int64_t>& block, int64_t r, int64_t c) {
  const uint8_t code = reinterpret_cast<const uint8_t*>(x.codes.data())[r * kIn + c];
  int64_t s = 0;
  if (!block.empty()) s = (r / block[0]) * x.scales.dim(1) + c / block[1];
  float scale = 0;
  convert_elements(x.scales.data() + s * dtype_size(x.scales.dtype()), x.scales.dtype(), &scale,
                   DType::F32, 1);
  return f8e4m3_to_f32(code) * scale;
}

TEST(LoadFp8, ScaledWeightsLoadAsTheirValuesInEveryLayout) {
  struct Scheme {
    std::vector<int64_t> block;
    DType scale_dtype;
  };
  for (const Scheme& scheme :
       {Scheme{{}, DType::F32}, Scheme{{1, 32}, DType::F8_E8M0}, Scheme{{128, 128}, DType::F32}}) {
    std::vector<Fp8Expert> experts;
    for (int64_t e = 0; e < kN; ++e)
      experts.push_back(make_expert(e, scheme.block, scheme.scale_dtype));
    for (bool stacked : {false, true}) {
      StateDict sd;
      if (stacked) {
        std::vector<Tensor> w, s;
        for (const Fp8Expert& x : experts) {
          w.push_back(x.codes);
          s.push_back(x.scales);
        }
        sd.insert("weight", testing::stack(w));
        sd.insert("weight_scale_inv", testing::stack(s));
      } else {
        for (int64_t e = 0; e < kN; ++e) {
          sd.insert("weight" + std::to_string(e), experts[static_cast<size_t>(e)].codes);
          sd.insert("weight" + std::to_string(e) + "_scale_inv",
                    experts[static_cast<size_t>(e)].scales);
        }
      }
      for (DType dtype : {DType::F32, DType::BF16}) {
        for (WeightLayout layout : testing::kLayouts) {
          SCOPED_TRACE(shape_to_string(experts[0].scales.shape()) +
                       (stacked ? " stacked " : " per-expert ") + std::string(dtype_name(dtype)) +
                       " into " + std::string(layout_name(layout)));
          GroupedLinear gl({.num_gemms = kN,
                            .in_features = kIn,
                            .out_features = kOut,
                            .bias = false,
                            .params_dtype = dtype,
                            .weight_layout = layout});
          const LoadReport report = gl.load_state_dict(sd);
          ASSERT_FALSE(report.dtype_conversions.empty());
          EXPECT_EQ(report.dtype_conversions[0].from, DType::F8_E4M3);
          size_t differ = 0;
          for (int64_t e = 0; e < kN; ++e) {
            const Tensor w = gl.expert_weight(e).to(DType::F32);
            const auto* got = reinterpret_cast<const float*>(w.data());
            for (int64_t r = 0; r < kOut; ++r) {
              for (int64_t c = 0; c < kIn; ++c) {
                float want = value(experts[static_cast<size_t>(e)], scheme.block, r, c);
                if (dtype == DType::BF16) want = bf16_to_f32(f32_to_bf16(want));
                differ += std::memcmp(&want, &got[r * kIn + c], 4) != 0;
              }
            }
          }
          EXPECT_EQ(differ, 0u);
        }
      }
    }
  }
}

}  // namespace
}  // namespace grouplin
