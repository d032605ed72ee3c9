// Layout rules: the built-in Hugging Face sets (module lists <-> transformers v5's fused
// experts), the rule file format and its errors, expert slices, and planned-tensor views.
#include "grouplin/layout_rules.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "hostile_text.hpp"
#include "io/moe_checkpoint.hpp"
#include "layout/plan.hpp"

namespace grouplin {
namespace {

using testing::hf_state_dict;
using testing::HfSpec;

// The plan as a dict of name -> bytes (pieces concatenated), with dtype and shape checked.
std::map<std::string, std::vector<std::byte>> bytes_of(const ConversionPlan& plan) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const PlannedTensor& t : plan.tensors) {
    std::vector<std::byte> b;
    for (const Tensor& p : t.pieces) b.insert(b.end(), p.data(), p.data() + p.nbytes());
    EXPECT_EQ(b.size(), static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype)) << t.name;
    EXPECT_TRUE(out.emplace(t.name, std::move(b)).second) << "twice: " << t.name;
  }
  return out;
}

std::map<std::string, std::vector<std::byte>> bytes_of(const StateDict& sd) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, t] : sd) out[name].assign(t.data(), t.data() + t.nbytes());
  return out;
}

void expect_shapes(const ConversionPlan& plan, const StateDict& want) {
  ASSERT_EQ(plan.tensors.size(), want.size());
  for (const PlannedTensor& t : plan.tensors) {
    ASSERT_TRUE(want.contains(t.name)) << t.name;
    EXPECT_EQ(t.shape, want.at(t.name).shape()) << t.name;
    EXPECT_EQ(t.dtype, want.at(t.name).dtype()) << t.name;
  }
}

TEST(LayoutRules, BuiltinSetsAreWellFormed) {
  for (const std::string& name : builtin_rule_names()) {
    const LayoutRules r = builtin_rules(name);
    EXPECT_EQ(r.name, name);
    EXPECT_FALSE(r.tensors.empty());
  }
  // A family's set is named after its model type, built on its structure.
  EXPECT_EQ(rules_for_model_type("mixtral"), "mixtral");
  EXPECT_EQ(rules_for_model_type("qwen3_moe"), "qwen3_moe");
  EXPECT_EQ(rules_for_model_type("llama"), std::nullopt);
  EXPECT_EQ(rules_to_json(builtin_rules("mixtral")).find("hf-mixtral"), std::string::npos);
  EXPECT_EQ(builtin_rules("mixtral").renames, builtin_rules("hf-mixtral").renames);
  EXPECT_EQ(builtin_rules("phimoe").renames.size(), 2u);  // block_sparse_moe, then the router
  const Error e = [] {
    try {
      builtin_rules("hf2");
    } catch (const Error& e) {
      return e;
    }
    return Error(ErrorCode::InvalidArgument, "no error");
  }();
  EXPECT_NE(e.message().find("known: te, hf, hf-w1w3, hf-mixtral, hf-fc"), std::string::npos)
      << e.what();
}

// Module lists <-> fused experts, for the families transformers v5 fuses, both ways, bit for bit.
TEST(LayoutRules, HuggingFaceModuleListsAndFusedExpertsConvertBothWays) {
  for (const char* family : {"qwen", "mixtral"}) {
    for (bool scales : {false, true}) {
      SCOPED_TRACE(std::string(family) + (scales ? " with FP8 scales" : ""));
      // Block scales fuse exactly only when I is a multiple of the block rows (scale_rules_test).
      const HfSpec spec{.family = family, .inter = scales ? 128 : 4, .scales = scales};
      const StateDict per_expert = hf_state_dict(spec, false);
      const StateDict fused = hf_state_dict(spec, true);
      const std::string rules = std::string(family) == "mixtral" ? "hf-mixtral" : "hf";

      GroupedScan scan = scan_grouped_modules(per_expert);
      ASSERT_TRUE(scan.problems.empty()) << scan.problems.front().what();
      ASSERT_EQ(scan.modules.size(), 2u);
      EXPECT_EQ(scan.modules[0].rules, rules);
      EXPECT_EQ(scan.modules[0].num_experts, 4);
      EXPECT_EQ(scan.modules[0].tensors.size(), scales ? 4u : 2u);
      EXPECT_EQ(scan.modules[0].tensors[0].expert_shape, (Shape{2 * spec.inter, 6}));  // [2I, H]
      if (scales) {
        EXPECT_EQ(scan.modules[0].tensors[2].scale_of, "model.layers.0.mlp.experts.gate_up_proj");
        EXPECT_EQ(scan.modules[0].tensors[2].block, (std::vector<int64_t>{128, 128}));
      }

      const ConversionPlan to_fused = plan_conversion(per_expert, ExpertLayout::Single);
      expect_shapes(to_fused, fused);
      EXPECT_EQ(bytes_of(to_fused), bytes_of(fused));

      // Back: the fused form does not name its family; the model type (config.json) does.
      PlanOptions o;
      o.model_type = std::string(family) == "mixtral" ? "mixtral" : "qwen3_moe";
      const ConversionPlan back = plan_conversion(fused, ExpertLayout::PerExpert, o);
      expect_shapes(back, per_expert);
      EXPECT_EQ(bytes_of(back), bytes_of(per_expert));
      if (!scales) {  // expert-major, as module lists save: the same order as the source
        std::vector<std::string> names;
        for (const PlannedTensor& t : back.tensors) names.push_back(t.name);
        EXPECT_EQ(names, per_expert.keys());
      }
      // Without the model type, fused experts are read as the common hf family.
      EXPECT_EQ(scan_grouped_modules(fused).modules.at(0).rules, "hf");
    }
  }
}

// Each stacked tensor's pieces are the experts' entries themselves (no copy), and the way back
// views the fused tensor: expert e's up rows start I rows into its gate_up slice.
TEST(LayoutRules, FusedPlansAreViews) {
  const StateDict per_expert = hf_state_dict({}, false);
  const ConversionPlan to_fused = plan_conversion(per_expert, ExpertLayout::Single);
  const auto gate_up = std::find_if(
      to_fused.tensors.begin(), to_fused.tensors.end(),
      [](const PlannedTensor& t) { return t.name == "model.layers.1.mlp.experts.gate_up_proj"; });
  ASSERT_NE(gate_up, to_fused.tensors.end());
  ASSERT_EQ(gate_up->pieces.size(), 8u);  // gate_0, up_0, gate_1, ...
  EXPECT_TRUE(
      gate_up->pieces[3].same_view(per_expert.at("model.layers.1.mlp.experts.1.up_proj.weight")));

  const StateDict fused = hf_state_dict({}, true);
  const ConversionPlan back = plan_conversion(fused, ExpertLayout::PerExpert);
  const Tensor& stacked = fused.at("model.layers.0.mlp.experts.gate_up_proj");
  for (const PlannedTensor& t : back.tensors) {
    if (t.name != "model.layers.0.mlp.experts.2.up_proj.weight") continue;
    ASSERT_EQ(t.pieces.size(), 1u);
    EXPECT_EQ(t.pieces[0].storage(), stacked.storage());
    EXPECT_EQ(t.pieces[0].data(), stacked.data() + (2 * 8 + 4) * 6 * 2);  // BF16
  }
}

// Mixtral's fused form renames ".block_sparse_moe." to ".mlp." in every key, the router's too.
TEST(LayoutRules, MixtralRenamesEveryKeyBothWays) {
  const StateDict per_expert = hf_state_dict({.family = "mixtral"}, false);
  const ConversionPlan to_fused = plan_conversion(per_expert, ExpertLayout::Single);
  std::vector<std::string> names;
  for (const PlannedTensor& t : to_fused.tensors) names.push_back(t.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.0.mlp.gate.weight"), names.end());
  for (const std::string& n : names) EXPECT_EQ(n.find("block_sparse_moe"), std::string::npos) << n;
}

// Expert slices: one rank keeps experts [begin, end) of every module, renumbered from 0, made of
// those experts' bytes only.
TEST(LayoutRules, ExpertSlicesKeepOnlyTheirExperts) {
  const StateDict per_expert = hf_state_dict({}, false);
  const StateDict fused = hf_state_dict({}, true);
  PlanOptions o;
  o.experts = ExpertRange{1, 3};
  for (const StateDict* src : {&per_expert, &fused}) {
    for (ExpertLayout to : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
      SCOPED_TRACE(std::string(src == &fused ? "fused" : "per-expert") + " -> " +
                   std::string(layout_name(to)));
      const ConversionPlan plan = plan_conversion(*src, to, o);
      const auto got = bytes_of(plan);
      if (to == ExpertLayout::PerExpert) {
        EXPECT_EQ(got.count("model.layers.0.mlp.experts.2.gate_proj.weight"), 0u);
        EXPECT_EQ(got.at("model.layers.0.mlp.experts.0.down_proj.weight"),
                  bytes_of(per_expert).at("model.layers.0.mlp.experts.1.down_proj.weight"));
      } else {
        const std::vector<std::byte>& down = got.at("model.layers.0.mlp.experts.down_proj");
        const auto fused_bytes = bytes_of(fused);
        const std::vector<std::byte>& all = fused_bytes.at("model.layers.0.mlp.experts.down_proj");
        const size_t expert_bytes = 6 * 4 * 2;
        ASSERT_EQ(down.size(), 2 * expert_bytes);
        EXPECT_TRUE(std::equal(down.begin(), down.end(), all.begin() + expert_bytes));
      }
      EXPECT_EQ(got.at("model.layers.0.mlp.gate.weight").size(), 4u * 6 * 2);  // router whole
    }
  }
  o.experts = ExpertRange{2, 5};
  EXPECT_THROW(plan_conversion(per_expert, ExpertLayout::Single, o), Error);
}

TEST(LayoutRules, HuggingFaceModuleProblems) {
  StateDict sd = hf_state_dict({}, false);
  sd.erase("model.layers.1.mlp.experts.2.down_proj.weight");
  GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::PartialExpertSet);
  EXPECT_NE(scan.problems[0].message().find("2.down_proj.weight"), std::string::npos)
      << scan.problems[0].what();

  sd = hf_state_dict({}, false);
  sd.set("model.layers.0.mlp.experts.3.up_proj.weight", Tensor::zeros({4, 7}, DType::BF16));
  scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ShapeMismatch);

  sd = hf_state_dict({}, false);
  sd.set("model.layers.0.mlp.experts.0.down_proj.weight", Tensor::zeros({6, 5}, DType::BF16));
  for (int e = 1; e < 4; ++e) {
    sd.set("model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj.weight",
           Tensor::zeros({6, 5}, DType::BF16));
  }
  scan = scan_grouped_modules(sd);  // down's inter (5) disagrees with gate's (4)
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(scan.problems[0].message().find("inter = 4"), std::string::npos)
      << scan.problems[0].what();

  sd = hf_state_dict({}, true);
  sd.set("model.layers.0.mlp.experts.gate_up_proj", Tensor::zeros({4, 7, 6}, DType::BF16));
  scan = scan_grouped_modules(sd);  // 7 rows do not split into gate and up
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ShapeMismatch);
}

TEST(LayoutRules, RuleFilesParseAndConvert) {
  const LayoutRules r = parse_rules(R"({
    "name": "mine", "order": "expert-major",
    "renames": [{"from": ".moe.", "to": ".ffn."}],
    "tensors": [
      {"stacked": "{prefix}w_in", "parts": ["{prefix}e{expert}.a", "{prefix}e{expert}.b"],
       "dims": ["r", "c"]},
      {"stacked": "{prefix}w_out", "parts": ["{prefix}e{expert}.o"], "dims": ["c", "r"],
       "optional": true}
    ]})",
                                    "mine.json");
  StateDict sd;
  for (int e = 0; e < 3; ++e) {
    const std::string p = "net.moe.e" + std::to_string(e) + ".";
    sd.insert(p + "a", testing::pattern_tensor({2, 5}, DType::F32, 10 + e));
    sd.insert(p + "b", testing::pattern_tensor({2, 5}, DType::F32, 20 + e));
  }
  PlanOptions o;
  o.rules = {r};
  const ConversionPlan plan = plan_conversion(sd, ExpertLayout::Single, o);
  ASSERT_EQ(plan.tensors.size(), 1u);
  EXPECT_EQ(plan.tensors[0].name, "net.ffn.w_in");
  EXPECT_EQ(plan.tensors[0].shape, (Shape{3, 4, 5}));
  EXPECT_EQ(plan.modules.at(0).rules, "mine");

  // A given set that matches nothing is an error, not a silent no-op.
  o.rules = {r, builtin_rules("hf")};
  try {
    plan_conversion(sd, ExpertLayout::Single, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RuleMatchedNothing) << e.what();
    EXPECT_NE(e.message().find("\"hf\""), std::string::npos) << e.what();
  }
  // Two given sets that claim one key.
  o.rules = {r, parse_rules(R"({"name": "other", "tensors": [
      {"stacked": "{prefix}x", "parts": ["{prefix}e{expert}.a"], "dims": ["r", "c"]}]})",
                            "other.json")};
  try {
    plan_conversion(sd, ExpertLayout::Single, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RuleConflict) << e.what();
    EXPECT_NE(e.message().find("net.moe.e0.a"), std::string::npos) << e.what();
  }
}

// Regression: a rules file that is no JSON was reported with nlohmann's message as it was, whose
// "last read" token carried DEL, C1 controls and direction overrides raw to the terminal.
TEST(LayoutRules, ParserTextInMessagesIsEscaped) {
  for (const test_text::HostileControl& c : test_text::kHostileControls) {
    SCOPED_TRACE(c.escaped);
    try {
      parse_rules(R"({"name": "x)" + c.raw + "\x01\"}", "rules.json");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidRules);
      EXPECT_NE(e.message().find("not JSON"), std::string::npos) << e.message();
      test_text::expect_escaped(e.message(), c);
    }
  }
}

TEST(LayoutRules, BadRuleFilesNameWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[", "not JSON"},
      {"[]", "not an object"},
      {R"({"tensors": []})", "has no \"name\""},
      {R"({"name": "x", "tensors": []})", "no tensors"},
      {R"({"name": "x", "colour": 1, "tensors": []})", "unknown field \"colour\""},
      {R"({"name": "x", "tensors": [{"stacked": "w", "parts": ["{prefix}w{expert}"],
          "dims": ["a"]}]})",
       "does not start with {prefix}"},
      {R"({"name": "x", "tensors": [{"stacked": "{prefix}w", "parts": ["{prefix}w"],
          "dims": ["a"]}]})",
       "has no {expert}"},
      {R"({"name": "x", "tensors": [{"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"],
          "dims": ["a"], "optional": true}]})",
       "the first is required"},
      {R"({"name": "x", "tensors": [{"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"]}]})",
       "has no \"dims\""},
      {R"({"name": "x", "order": "random", "tensors": []})", "order \"random\""},
      {R"({"name": "x", "joins": [{"whole": "qkv", "parts": ["q"]}], "tensors": [{"stacked":
          "{prefix}w", "parts": ["{prefix}w{expert}"], "dims": ["a"]}]})",
       "at least two non-empty parts"},
      {R"({"name": "x", "joins": [{"whole": "qkv", "parts": ["qkv", "q"]}], "tensors": [
          {"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"], "dims": ["a"]}]})",
       "each other than the whole"},
      {R"({"name": "x", "joins": [{"whole": "qkv", "parts": ["q", "k"], "dim": 1}],
          "tensors": []})",
       "joins[0] has unknown field \"dim\""},
      {R"({"name": "x", "grouped_linear_names": true, "tensors": [{"stacked": "{prefix}w",
          "parts": ["{prefix}w{expert}"], "dims": ["a"]}]})",
       "the set's names are not GroupedLinear's"},
      {R"({"name": "x", "grouped_linear_names": 1, "tensors": [{"stacked": "{prefix}weight",
          "parts": ["{prefix}weight{expert}"], "dims": ["a"]}]})",
       "grouped_linear_names is not true or false"},
  };
  for (const auto& [text, part] : bad) {
    SCOPED_TRACE(text);
    try {
      parse_rules(text, "r.json");
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidRules) << e.what();
      EXPECT_NE(e.message().find("rules \"r.json\": "), std::string::npos) << e.what();
      EXPECT_NE(e.message().find(part), std::string::npos) << e.what();
    }
  }
}

TEST(LayoutRules, PlannedTensorSelectViewsTheRightBytes) {
  const Tensor a = testing::pattern_tensor({2, 3}, DType::F32, 1);
  const Tensor b = testing::pattern_tensor({4, 3}, DType::F32, 2);
  const PlannedTensor t{"t", DType::F32, {3, 2, 3}, {a, b}};
  for (int64_t i = 0; i < 3; ++i) {
    const PlannedTensor s = t.select(i);
    EXPECT_EQ(s.shape, (Shape{2, 3}));
    std::vector<std::byte> got;
    for (const Tensor& p : s.pieces) got.insert(got.end(), p.data(), p.data() + p.nbytes());
    std::vector<std::byte> all(a.data(), a.data() + a.nbytes());
    all.insert(all.end(), b.data(), b.data() + b.nbytes());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), all.begin() + i * 24)) << i;
  }
  EXPECT_THROW(t.select(3), Error);
}

}  // namespace
}  // namespace grouplin
