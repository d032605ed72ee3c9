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

namespace grouplin {
namespace {

// A directory holding `sd` as model.safetensors beside a config.json naming `model_type`.
void write_model_dir(const std::filesystem::path& dir, const StateDict& sd,
                     const std::string& model_type) {
  std::filesystem::create_directories(dir);
  save_safetensors((dir / "model.safetensors").string(), sd);
  std::ofstream(dir / "config.json") << "{\"model_type\": \"" << model_type << "\"}\n";
}

// Llama 4's experts as transformers saves them: stacked and transposed, gate_up_proj [N, H, 2I],
// down_proj [N, I, H]; with a router and a conv1d-like tensor that no conversion may touch.
StateDict llama4_experts() {
  StateDict sd;
  sd.insert("model.layers.0.feed_forward.experts.gate_up_proj",
            testing::pattern_tensor({3, 6, 8}, DType::BF16, 1));
  sd.insert("model.layers.0.feed_forward.experts.down_proj",
            testing::pattern_tensor({3, 4, 6}, DType::BF16, 2));
  sd.insert("model.layers.0.feed_forward.router.weight",
            testing::pattern_tensor({3, 6}, DType::BF16, 3));
  sd.insert("model.layers.0.conv.conv1d.weight",
            testing::pattern_tensor({5, 1, 3}, DType::BF16, 4));
  return sd;
}

// A stacked-only family: inspect shows it in its orientation, single keeps it byte for byte,
// per-expert is a named refusal that writes nothing, and --rules te writes TransformerEngine
// weights [out, in] that come back to the same bytes.
TEST_F(CliRulesTest, StackedOnlyFamilyRefusesPerExpertWithoutTe) {
  const std::filesystem::path in = dir_ / "llama4";
  write_model_dir(in, llama4_experts(), "llama4_text");
  CliRun r = run({"inspect", in.string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["grouped_modules"].size(), 1u);
  EXPECT_EQ(doc["grouped_modules"][0]["rules"], "llama4_text");
  EXPECT_EQ(doc["grouped_modules"][0]["stacked_only"], true);
  EXPECT_EQ(doc["grouped_modules"][0]["out_features"], 8);
  EXPECT_EQ(doc["grouped_modules"][0]["tensors"][0]["transposed"], true);
  r = run({"inspect", in.string()});
  EXPECT_NE(r.out.find("stacked only; gate_up_proj stored [N, in, out]"), std::string::npos)
      << r.out;

  r = run({"convert", in.string(), path("single"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_dict(load_checkpoint(path("single")).tensors, llama4_experts());

  r = run({"convert", in.string(), path("per-expert"), "--layout", "per-expert"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("NoPerExpertForm"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.layers.0.feed_forward.experts."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--rules te"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("per-expert")));

  r = run({"convert", in.string(), path("te"), "--layout", "per-expert", "--rules", "te"});
  ASSERT_EQ(r.code, 0) << r.err;
  const StateDict te = load_checkpoint(path("te")).tensors;
  ASSERT_TRUE(te.contains("model.layers.0.feed_forward.experts.gate_up_proj.weight2"));
  EXPECT_EQ(te.at("model.layers.0.feed_forward.experts.gate_up_proj.weight2").shape(),
            (Shape{8, 6}));
  EXPECT_TRUE(te.at("model.layers.0.conv.conv1d.weight")
                  .bit_equal(llama4_experts().at("model.layers.0.conv.conv1d.weight")));
  // The same through the .pt writer, whose reading thread also computes each record's CRC-32 over
  // the transposed bytes.
  r = run({"convert", in.string(), path("te.pt"), "--layout", "per-expert", "--rules", "te"});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_dict(load_checkpoint(path("te.pt")).tensors, te);
  r = run({"verify", path("te.pt"), in.string(), "--rules", "llama4_text"});  // CRCs checked
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = run({"convert", path("te"), path("back"), "--layout", "single"});  // config.json was copied
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_dict(load_checkpoint(path("back")).tensors, llama4_experts());
  r = run({"verify", in.string(), path("te")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// grouplin rules lists the structures and the model families; one set prints as JSON that
// --rules reads back from a file.
TEST_F(CliRulesTest, RulesCommandListsAndPrintsSets) {
  CliRun r = run({"rules"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* word :
       {"structures: te hf", "qwen3_moe", "gpt_oss", "gpt-oss", "dbrx", "unsupported:"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
  r = run({"rules", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_GE(doc["families"].size(), 60u);
  EXPECT_FALSE(doc["transformers_checked"].get<std::string>().empty());
  r = run({"rules", "mixtral"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ofstream(path("mine.json")) << r.out;
  const HfSpec mixtral{.family = "mixtral"};
  save_safetensors(path("fused.safetensors"), hf_state_dict(mixtral, true));
  r = run({"convert", path("fused.safetensors"), path("back.safetensors"), "--layout", "per-expert",
           "--rules", path("mine.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_dict(load_checkpoint(path("back.safetensors")).tensors,
                   hf_state_dict(mixtral, false));
  r = run({"rules", "no_such_model"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no such built-in set"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace grouplin
