// The command line with FP8 checkpoints: scales that follow their weights through convert,
// dequantization on request (--dtype), and the FP8 inputs that must exit 2 with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/safetensors.hpp"
#include "io/moe_checkpoint.hpp"
#include "temp_dir_test.hpp"
#include "tools/cli_runner.hpp"

namespace grouplin {
namespace {

using testing::hf_state_dict;
using testing::pattern_tensor;

class CliFp8Test : public test_files::TempDirTest {
 protected:
  CliFp8Test() : TempDirTest("grouplin_cli_fp8") {}
  CliRun run(const std::vector<std::string>& args) const { return run_cli(dir_, args); }
  bool exists(const std::string& name) const { return std::filesystem::exists(path(name)); }
};

// Experts in FP8 with [128, 128] block scales, converted to the fused form and dequantized.
TEST_F(CliFp8Test, ScaledExpertsFuseAndDequantize) {
  // As FP8 checkpoints are: experts in FP8 with their scales, everything else in BF16.
  const StateDict fp8 =
      hf_state_dict({.inter = 128, .dtype = DType::F8_E4M3, .scales = true}, false);
  StateDict sd;
  for (const auto& [name, t] : fp8) {
    const bool expert = name.find(".experts.") != std::string::npos;
    sd.insert(name, expert || t.dtype() != DType::F8_E4M3 ? t : t.to(DType::BF16));
  }
  save_safetensors(path("fp8.safetensors"), sd);
  CliRun r = run({"inspect", path("fp8.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("FP8 scales of gate_up_proj in [128, 128] blocks"), std::string::npos)
      << r.out;
  r = run({"convert", path("fp8.safetensors"), path("fused.safetensors"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  const StateDict fused = load_checkpoint(path("fused.safetensors")).tensors;
  EXPECT_EQ(fused.at("model.layers.0.mlp.experts.gate_up_proj_scale_inv").shape(),
            (Shape{4, 2, 1}));
  r = run({"verify", path("fp8.safetensors"), path("fused.safetensors")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;

  r = run({"convert", path("fused.safetensors"), path("bf16.safetensors"), "--layout", "per-expert",
           "--dtype", "bf16"});
  ASSERT_EQ(r.code, 0) << r.err;
  // 2 layers x 4 experts x gate, up, down.
  EXPECT_NE(r.out.find("dequantized: 24 FP8 weight(s) written as BF16, their scales dropped"),
            std::string::npos)
      << r.out;
  const StateDict bf16 = load_checkpoint(path("bf16.safetensors")).tensors;
  EXPECT_EQ(bf16.at("model.layers.1.mlp.experts.3.down_proj.weight").dtype(), DType::BF16);
  EXPECT_FALSE(bf16.contains("model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"));
  EXPECT_EQ(bf16.at("model.embed_tokens.weight").dtype(), DType::BF16);  // unchanged
}

TEST_F(CliFp8Test, FusingScalesOffABlockBoundaryExitsTwoWritingNothing) {
  // I = 4: gate's and up's scales are one block row each; fused, one block would hold both.
  save_safetensors(path("fp8.safetensors"),
                   hf_state_dict({.dtype = DType::F8_E4M3, .scales = true}, false));
  CliRun r = run({"inspect", path("fp8.safetensors")});
  EXPECT_EQ(r.code, 0) << r.err;  // a valid checkpoint
  r = run({"convert", path("fp8.safetensors"), path("fused.safetensors"), "--layout", "single"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("grouplin: ScaleBlocksUnaligned:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"model.layers.0.mlp.experts.gate_up_proj_scale_inv\""), std::string::npos)
      << r.err;
  EXPECT_FALSE(exists("fused.safetensors"));
}

TEST_F(CliFp8Test, DenseScalesOfNoBlockAreAProblemAndRefusedByDtype) {
  StateDict sd;
  sd.insert("model.layers.0.self_attn.o_proj.weight", pattern_tensor({256, 64}, DType::F8_E4M3, 1));
  sd.insert("model.layers.0.self_attn.o_proj.weight_scale_inv",
            pattern_tensor({3, 1}, DType::F32, 2));
  sd.insert("model.norm.weight", pattern_tensor({64}, DType::F8_E4M3, 3));
  save_safetensors(path("bad.safetensors"), sd);
  CliRun r = run({"inspect", path("bad.safetensors"), "--json"});
  EXPECT_EQ(r.code, 2);
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["problems"].size(), 1u) << r.out;
  EXPECT_EQ(doc["problems"][0]["code"], "ScaleShapeMismatch");
  EXPECT_NE(doc["problems"][0]["message"].get<std::string>().find(
                "\"model.layers.0.self_attn.o_proj.weight_scale_inv\" has shape [3, 1]"),
            std::string::npos)
      << r.out;

  r = run({"convert", path("bad.safetensors"), path("out.safetensors"), "--layout", "single",
           "--dtype", "f32"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("grouplin: ScaleShapeMismatch:"), std::string::npos) << r.err;
  EXPECT_FALSE(exists("out.safetensors"));

  sd.erase("model.layers.0.self_attn.o_proj.weight_scale_inv");
  save_safetensors(path("noscale.safetensors"), sd);
  r = run({"convert", path("noscale.safetensors"), path("out.safetensors"), "--layout", "single",
           "--dtype", "bf16"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("grouplin: Fp8ScalesNotApplied:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"model.layers.0.self_attn.o_proj.weight_scale_inv\""), std::string::npos)
      << r.err;
  EXPECT_FALSE(exists("out.safetensors"));
}

}  // namespace
}  // namespace grouplin
