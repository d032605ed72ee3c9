// Dequantization on request (ConvertOptions::dtype): FP8 checkpoints written by the reference
// safetensors package (tests/io/fp8_peer.py: Qwen3-FP8 experts with [128, 128] block scales, a
// dense FP8 layer, MXFP8 experts with E8M0 scales, per-tensor scaled experts) converted to F32 and
// BF16 in both layouts, checked bit for bit against numpy's (q.astype(f32) * scale).astype(dtype);
// and the inputs that cannot be dequantized, refused by name with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "grouplin/convert.hpp"
#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/python_peer.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

using testing::pattern_tensor;

class Fp8Dequantize : public test_files::TempDirTest {
 protected:
  Fp8Dequantize() : TempDirTest("grouplin_fp8") {}
  void peer(const std::string& args) {
    std::string output;
    ASSERT_EQ(test_io::run_python_peer("tests/io/fp8_peer.py", args, output), 0) << output;
  }
  Error convert_error(const StateDict& sd) {
    save_safetensors(path("in.safetensors"), sd);
    ConvertOptions o;
    o.dtype = DType::BF16;
    try {
      convert_checkpoint(path("in.safetensors"), path("out.safetensors"), o);
    } catch (const Error& e) {
      EXPECT_FALSE(std::filesystem::exists(path("out.safetensors")));
      return e;
    }
    return Error(ErrorCode::InvalidArgument, "no error");
  }
};

TEST_F(Fp8Dequantize, ValuesAreNumpysBitForBitInBothLayouts) {
  ASSERT_NO_FATAL_FAILURE(peer("make " + dir_.string()));
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (ExpertLayout layout : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
      const std::string name =
          std::string(dtype_name(dtype)) + "_" + std::string(layout_name(layout)) + ".safetensors";
      SCOPED_TRACE(name);
      ConvertOptions o;
      o.layout = layout;
      o.dtype = dtype;
      const ConvertReport r = convert_checkpoint(path("fp8.safetensors"), path(name), o);
      // Per-expert: 3 x 3 expert parts, o_proj, 2 x 2 TE experts; single: gate_up_proj,
      // down_proj, o_proj and the two TE weights.
      EXPECT_EQ(r.dequantized, layout == ExpertLayout::PerExpert ? 14u : 5u);
      ASSERT_NO_FATAL_FAILURE(peer("check " + path("fp8.safetensors") + " " + path(name) + " " +
                                   (dtype == DType::F32 ? "f32" : "bf16") + " " +
                                   std::string(layout_name(layout))));
    }
  }
}

TEST_F(Fp8Dequantize, WeightsWithoutScalesOrWithScalesOfNoBlockAreRefused) {
  StateDict sd;
  sd.insert("model.layers.0.self_attn.o_proj.weight", pattern_tensor({4, 8}, DType::F8_E4M3, 1));
  Error e = convert_error(sd);
  EXPECT_EQ(e.code(), ErrorCode::Fp8ScalesNotApplied) << e.what();
  EXPECT_NE(std::string(e.what()).find("\"model.layers.0.self_attn.o_proj.weight_scale_inv\""),
            std::string::npos)
      << e.what();

  sd.insert("model.layers.0.self_attn.o_proj.weight_scale_inv",
            pattern_tensor({2, 3}, DType::F32, 2));
  e = convert_error(sd);
  EXPECT_EQ(e.code(), ErrorCode::ScaleShapeMismatch) << e.what();
  EXPECT_NE(std::string(e.what()).find("has shape [2, 3]; its scales would be [1, 1] ([128, 128] "
                                       "blocks) or [4, 1] ([1, 32] blocks) or [1] (one per "
                                       "matrix)"),
            std::string::npos)
      << e.what();
}

}  // namespace
}  // namespace grouplin
