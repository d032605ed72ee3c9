// The command line with layout rules: Hugging Face module lists <-> transformers v5's fused
// experts through convert, inspect and verify; --rules and --experts and their bad values.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/same_dict.hpp"
#include "temp_dir_test.hpp"
#include "tools/cli_runner.hpp"

namespace grouplin {
namespace {

using testing::expect_same_dict;
using testing::hf_state_dict;
using testing::HfSpec;

class CliRulesTest : public test_files::TempDirTest {
 protected:
  CliRulesTest() : TempDirTest("grouplin_cli_rules") {}
  CliRun run(const std::vector<std::string>& args) const { return run_cli(dir_, args); }
};

TEST_F(CliRulesTest, QwenModuleListsConvertToFusedExpertsAndBackByteForByte) {
  save_safetensors(path("hf.safetensors"), hf_state_dict({}, false), {{"format", "pt"}});
  CliRun r =
      run({"convert", path("hf.safetensors"), path("fused.safetensors"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_dict(load_checkpoint(path("fused.safetensors")).tensors, hf_state_dict({}, true));

  r = run({"inspect", path("fused.safetensors"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["grouped_modules"].size(), 2u);
  const auto& m = doc["grouped_modules"][0];
  EXPECT_EQ(m["rules"], "hf");
  EXPECT_EQ(m["layout"], "single");
  EXPECT_EQ(m["num_experts"], 4);
  ASSERT_EQ(m["tensors"].size(), 2u);
  EXPECT_EQ(m["tensors"][0]["name"], "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(m["tensors"][0]["expert_shape"], (std::vector<int64_t>{8, 6}));

  r = run(
      {"convert", path("fused.safetensors"), path("back.safetensors"), "--layout", "per-expert"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test_files::read_all(path("back.safetensors")) ==
              test_files::read_all(path("hf.safetensors")));
  r = run({"verify", path("hf.safetensors"), path("fused.safetensors")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(CliRulesTest, MixtralNeedsItsRulesToGoBack) {
  const HfSpec mixtral{.family = "mixtral"};
  save_pt(path("mixtral.pt"), hf_state_dict(mixtral, false));
  ASSERT_EQ(run({"convert", path("mixtral.pt"), path("fused.pt"), "--layout", "single"}).code, 0);
  expect_same_dict(load_checkpoint(path("fused.pt")).tensors, hf_state_dict(mixtral, true));
  // The fused names do not say Mixtral: --rules hf-mixtral (or config.json) brings back its names.
  CliRun r = run({"convert", path("fused.pt"), path("back.pt"), "--layout", "per-expert", "--rules",
                  "hf-mixtral"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test_files::read_all(path("back.pt")) == test_files::read_all(path("mixtral.pt")));
  r = run({"verify", path("mixtral.pt"), path("fused.pt"), "--rules", "hf-mixtral"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(CliRulesTest, ExpertSlicesAndRuleFiles) {
  save_safetensors(path("hf.safetensors"), hf_state_dict({}, false));
  CliRun r = run({"convert", path("hf.safetensors"), path("rank1.safetensors"), "--layout",
                  "single", "--experts", "2:4"});
  ASSERT_EQ(r.code, 0) << r.err;
  const StateDict rank1 = load_checkpoint(path("rank1.safetensors")).tensors;
  const StateDict fused = hf_state_dict({}, true);
  const Tensor& down = rank1.at("model.layers.1.mlp.experts.down_proj");
  EXPECT_EQ(down.shape(), (Shape{2, 6, 4}));
  EXPECT_TRUE(down.bit_equal(fused.at("model.layers.1.mlp.experts.down_proj").rows(2, 2)));

  std::ofstream(path("rules.json")) << R"({"name": "only-down", "order": "expert-major",
    "tensors": [{"stacked": "{prefix}down_proj", "parts": ["{prefix}{expert}.down_proj.weight"],
                 "dims": ["hidden", "inter"]}]})";
  r = run({"convert", path("hf.safetensors"), path("down.safetensors"), "--layout", "single",
           "--rules", path("rules.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  const StateDict down_only = load_checkpoint(path("down.safetensors")).tensors;
  EXPECT_TRUE(down_only.contains("model.layers.0.mlp.experts.down_proj"));
  EXPECT_TRUE(down_only.contains("model.layers.0.mlp.experts.0.gate_proj.weight"));
}

TEST_F(CliRulesTest, BadRulesAndSlicesExitTwoAndWriteNothing) {
  save_safetensors(path("hf.safetensors"), hf_state_dict({}, false));
  std::ofstream(path("bad.json")) << R"({"name": "x", "tensors": []})";
  struct Case {
    std::vector<std::string> extra;
    const char* text;
  };
  const std::vector<Case> cases = {
      {{"--rules", "hf2"}, "reading rules \"hf2\""},
      {{"--rules", path("bad.json")}, "InvalidRules"},
      {{"--rules", "te,,hf"}, "an empty item"},
      {{"--rules", "hf-mixtral"}, "RuleMatchedNothing"},
      {{"--experts", "3"}, "expected BEGIN:END"},
      {{"--experts", "3:3"}, "expected BEGIN:END"},
      {{"--experts", "2:9"}, "which has 4"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"convert", path("hf.safetensors"), path("out.safetensors"),
                                     "--layout", "single"};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const CliRun r = run(args);
    SCOPED_TRACE(c.text);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(c.text), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(path("out.safetensors")));
  }
}

}  // namespace
}  // namespace grouplin
