// FP8 scales as rule-bound siblings of their weights (StackedTensorRule::scale_of): their shapes
// checked against the weight's blocks, stacked and fused with the weights, and the conversions
// that would cut a block in two refused by name.
#include <gtest/gtest.h>

#include <map>

#include "error_of.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout_rules.hpp"
#include "io/moe_checkpoint.hpp"
#include "layout/dequantize_plan.hpp"
#include "layout/plan.hpp"

namespace grouplin {
namespace {

using testing::hf_state_dict;
using testing::HfSpec;
using testing::pattern_tensor;
using testing::stack;

using testing::error_of;

std::map<std::string, std::string> bytes_of(const ConversionPlan& plan) {
  std::map<std::string, std::string> out;
  for (const PlannedTensor& t : plan.tensors) {
    std::string b;
    for (const Tensor& p : t.pieces) b.append(reinterpret_cast<const char*>(p.data()), p.nbytes());
    out[t.name] = b;
  }
  return out;
}

std::map<std::string, std::string> bytes_of(const StateDict& sd) {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : sd)
    out[name].assign(reinterpret_cast<const char*>(t.data()), t.nbytes());
  return out;
}

// TransformerEngine-named experts with FP8 weights and one scale tensor per expert of `scale`
// shape and dtype, as per-expert entries or stacked ones.
StateDict te_fp8(const Shape& weight, const Shape& scale, DType scale_dtype, bool stacked) {
  StateDict sd;
  std::vector<Tensor> w, s;
  for (uint32_t e = 0; e < 3; ++e) {
    w.push_back(pattern_tensor(weight, DType::F8_E4M3, 10 + e));
    s.push_back(pattern_tensor(scale, scale_dtype, 20 + e));
  }
  if (stacked) {
    sd.insert("mlp.fc1.weight", stack(w));
    sd.insert("mlp.fc1.weight_scale_inv", stack(s));
  } else {
    for (size_t e = 0; e < 3; ++e) {
      sd.insert("mlp.fc1.weight" + std::to_string(e), w[e]);
      sd.insert("mlp.fc1.weight" + std::to_string(e) + "_scale_inv", s[e]);
    }
  }
  sd.insert("mlp.fc1._extra_state", Tensor::zeros({0}, DType::U8));
  return sd;
}

// Float8Tensor (one scale per expert) and MXFP8 ([1, 32] blocks, E8M0 scales) both ways.
TEST(ScaleRules, TeScalesStackWithTheirWeightsBothWays) {
  struct Case {
    Shape weight, scale;
    DType dtype;
    std::vector<int64_t> block;
  };
  for (const Case& c :
       {Case{{4, 64}, {1}, DType::F32, {}}, Case{{4, 64}, {4, 2}, DType::F8_E8M0, {1, 32}},
        Case{{130, 200}, {2, 2}, DType::F32, {128, 128}}}) {
    SCOPED_TRACE(shape_to_string(c.scale));
    const StateDict per_expert = te_fp8(c.weight, c.scale, c.dtype, false);
    const StateDict stacked = te_fp8(c.weight, c.scale, c.dtype, true);
    GroupedScan scan = scan_grouped_modules(per_expert);
    ASSERT_TRUE(scan.problems.empty()) << scan.problems.front().what();
    ASSERT_EQ(scan.modules.size(), 1u);
    ASSERT_EQ(scan.modules[0].tensors.size(), 2u);
    EXPECT_EQ(scan.modules[0].tensors[1].scale_of, "mlp.fc1.weight");
    EXPECT_EQ(scan.modules[0].tensors[1].block, c.block);
    EXPECT_EQ(bytes_of(plan_conversion(per_expert, ExpertLayout::Single)), bytes_of(stacked));
    EXPECT_EQ(bytes_of(plan_conversion(stacked, ExpertLayout::PerExpert)), bytes_of(per_expert));
  }
}

TEST(ScaleRules, AScaleThatFitsNoBlockIsNamedWithItsFullKey) {
  StateDict sd = te_fp8({130, 200}, {2, 2}, DType::F32, false);
  sd.erase("mlp.fc1.weight1_scale_inv");
  sd.insert("mlp.fc1.weight1_scale_inv", pattern_tensor({2, 3}, DType::F32, 1));
  GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  // Experts of one module scaled differently: the first rule (one shape for all experts) speaks.
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ShapeMismatch) << scan.problems[0].what();

  StateDict all = te_fp8({130, 200}, {2, 3}, DType::F32, false);
  scan = scan_grouped_modules(all);
  ASSERT_EQ(scan.problems.size(), 1u);
  const std::string what = scan.problems[0].what();
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ScaleShapeMismatch) << what;
  EXPECT_NE(what.find("\"mlp.fc1.weight0_scale_inv\" has shape [2, 3]"), std::string::npos) << what;
  EXPECT_NE(what.find("[2, 2] ([128, 128] blocks) or [130, 7] ([1, 32] blocks) or [1] (one per "
                      "expert)"),
            std::string::npos)
      << what;
}

// A weight whose siblings are scaled but it is not, and a scale whose weight is absent: both
// named with the full key.
TEST(ScaleRules, ScalesMissingOrAloneArePartialSets) {
  StateDict sd = te_fp8({4, 64}, {1}, DType::F32, false);
  sd.erase("mlp.fc1.weight1_scale_inv");
  GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::PartialExpertSet);
  EXPECT_NE(std::string(scan.problems[0].what()).find("weight1_scale_inv"), std::string::npos)
      << scan.problems[0].what();

  sd = te_fp8({4, 64}, {1}, DType::F32, false);
  sd.insert("mlp.fc1.weight3_scale_inv", pattern_tensor({1}, DType::F32, 9));
  scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::PartialExpertSet);
  EXPECT_NE(std::string(scan.problems[0].what())
                .find("has the scales \"mlp.fc1.weight3_scale_inv\" but not the weight they "
                      "scale, \"mlp.fc1.weight3\""),
            std::string::npos)
      << scan.problems[0].what();

  // A dense layer's scale beside its [out, in] weight is no module's.
  StateDict dense;
  dense.insert("model.lm_head.weight", pattern_tensor({4, 64}, DType::F8_E4M3, 1));
  dense.insert("model.lm_head.weight_scale_inv", pattern_tensor({1, 1}, DType::F32, 2));
  scan = scan_grouped_modules(dense);
  EXPECT_TRUE(scan.modules.empty());
  EXPECT_TRUE(scan.problems.empty());
}

TEST(ScaleRules, HuggingFaceScalesOfAWeightOfWrongBlocksAreRefused) {
  StateDict sd = hf_state_dict({.inter = 128, .scales = true}, false);
  const std::string key = "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv";
  for (int64_t e = 0; e < 4; ++e) {  // all experts alike: [1, 2] instead of [1, 1]
    const std::string k =
        "model.layers.1.mlp.experts." + std::to_string(e) + ".down_proj.weight_scale_inv";
    sd.erase(k);
    sd.insert(k, pattern_tensor({1, 2}, DType::F32, 3));
  }
  GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ScaleShapeMismatch);
  EXPECT_NE(std::string(scan.problems[0].what()).find(key), std::string::npos)
      << scan.problems[0].what();
}

// I = 4 with [128, 128] blocks: each part has its own block row. The per-expert checkpoint is
// valid; fusing gate and up would need one block to straddle both.
TEST(ScaleRules, FusingScalesOffABlockBoundaryIsANamedErrorAtPlanning) {
  const StateDict per_expert = hf_state_dict({.scales = true}, false);
  GroupedScan scan = scan_grouped_modules(per_expert);
  ASSERT_TRUE(scan.problems.empty()) << scan.problems.front().what();
  EXPECT_NO_THROW(plan_conversion(per_expert, ExpertLayout::PerExpert));
  const Error e = error_of([&] { plan_conversion(per_expert, ExpertLayout::Single); });
  EXPECT_EQ(e.code(), ErrorCode::ScaleBlocksUnaligned) << e.what();
  EXPECT_NE(std::string(e.what()).find("\"model.layers.0.mlp.experts.gate_up_proj_scale_inv\""),
            std::string::npos)
      << e.what();

  // The fused form with blocks over the fused rows (ceil(8 / 128) = 1 row): valid, not split.
  StateDict fused = hf_state_dict({.scales = true}, true);
  for (const char* layer : {"0", "1"}) {
    const std::string k =
        std::string("model.layers.") + layer + ".mlp.experts.gate_up_proj_scale_inv";
    fused.erase(k);
    fused.insert(k, pattern_tensor({4, 1, 1}, DType::F32, 5));
  }
  PlanOptions o;
  o.model_type = "qwen3_moe";
  scan = scan_grouped_modules(fused, {builtin_rules("qwen3_moe")});
  ASSERT_TRUE(scan.problems.empty()) << scan.problems.front().what();
  EXPECT_NO_THROW(plan_conversion(fused, ExpertLayout::Single, o));
  EXPECT_EQ(error_of([&] { plan_conversion(fused, ExpertLayout::PerExpert, o); }).code(),
            ErrorCode::ScaleBlocksUnaligned);
}

// The same unaligned module dequantized: its scales are dropped, so fusing is exact after all,
// each part's codes read with its own blocks (PlanOptions::dequantize); the fused values are the
// per-expert values, part after part. Without FP8 weights to drop them with, still refused.
TEST(ScaleRules, DequantizingFusesScalesOffABlockBoundary) {
  const StateDict floats = hf_state_dict({.scales = true}, false);
  StateDict per_expert;  // the weights as E4M3 codes of small distinct values
  for (const auto& [name, t] : floats) {
    if (name.find(".experts.") == std::string::npos ||
        name.find("scale_inv") != std::string::npos) {
      per_expert.insert(name, t);
      continue;
    }
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13) - 6.0f;
    per_expert.insert(name, Tensor::from_f32(t.shape(), v, DType::F8_E4M3));
  }
  PlanOptions o;
  o.dequantize = true;
  ConversionPlan fused = plan_conversion(per_expert, ExpertLayout::Single, o);
  ConversionPlan parts = plan_conversion(per_expert, ExpertLayout::PerExpert);
  layout::dequantize_plan(fused.tensors, DType::F32, layout::MissingScales::Refuse);
  layout::dequantize_plan(parts.tensors, DType::F32, layout::MissingScales::Refuse);
  std::map<std::string, std::vector<float>> values;
  for (const PlannedTensor& t : parts.tensors) {
    Tensor v = Tensor::zeros(t.shape, DType::F32);
    t.copy_to(v);
    values[t.name].assign(v.data_as<float>(), v.data_as<float>() + v.numel());
  }
  const std::string p = "model.layers.0.mlp.experts.";
  const PlannedTensor* gate_up = nullptr;
  for (const PlannedTensor& t : fused.tensors) {
    if (t.name == p + "gate_up_proj") gate_up = &t;
    EXPECT_EQ(t.name.find("scale_inv"), std::string::npos) << t.name << " left in the plan";
  }
  ASSERT_NE(gate_up, nullptr);
  Tensor got = Tensor::zeros(gate_up->shape, DType::F32);
  gate_up->copy_to(got);
  std::vector<float> want;
  for (int e = 0; e < 4; ++e) {
    for (const char* part : {"gate_proj", "up_proj"}) {
      const std::vector<float>& v = values.at(p + std::to_string(e) + "." + part + ".weight");
      want.insert(want.end(), v.begin(), v.end());
    }
  }
  EXPECT_EQ(std::vector<float>(got.data_as<float>(), got.data_as<float>() + got.numel()), want);

  // Planned for dequantization, but the weights are F32: the scales cannot be dropped.
  ConversionPlan kept = plan_conversion(floats, ExpertLayout::Single, o);
  EXPECT_EQ(error_of([&] {
              layout::dequantize_plan(kept.tensors, DType::F32, layout::MissingScales::Refuse);
            }).code(),
            ErrorCode::ScaleBlocksUnaligned);
}

// A family stored stacked on the Hub (GraniteMoE, Qwen3-VL-MoE, ...): its scales go to
// TransformerEngine's per-expert names with their weights, and back.
TEST(ScaleRules, StackedOnlyFamiliesCarryTheirScalesToTeNames) {
  StateDict single;
  const std::string p = "model.layers.0.mlp.experts.";
  single.insert(p + "gate_up_proj", pattern_tensor({3, 256, 200}, DType::F8_E4M3, 1));
  single.insert(p + "gate_up_proj_scale_inv", pattern_tensor({3, 2, 2}, DType::F32, 2));
  single.insert(p + "down_proj", pattern_tensor({3, 200, 128}, DType::F8_E4M3, 3));
  single.insert(p + "down_proj_scale_inv", pattern_tensor({3, 2, 1}, DType::F32, 4));
  PlanOptions o;
  o.rules = {builtin_rules("stacked"), builtin_rules("te")};
  GroupedScan scan = scan_grouped_modules(single, {builtin_rules("stacked")});
  ASSERT_TRUE(scan.problems.empty()) << scan.problems.front().what();
  ASSERT_EQ(scan.modules.size(), 1u);
  ASSERT_EQ(scan.modules[0].tensors.size(), 4u);
  EXPECT_EQ(scan.modules[0].tensors[2].block, (std::vector<int64_t>{128, 128}));
  const ConversionPlan per_expert = plan_conversion(single, ExpertLayout::PerExpert, o);
  StateDict te;
  for (const PlannedTensor& t : per_expert.tensors) {
    ASSERT_EQ(t.pieces.size(), 1u) << t.name;
    te.insert(t.name, t.pieces[0].reshape(t.shape));
  }
  ASSERT_TRUE(te.contains(p + "gate_up_proj.weight2_scale_inv"));
  EXPECT_EQ(te.at(p + "gate_up_proj.weight2_scale_inv").shape(), (Shape{2, 2}));
  PlanOptions back;
  back.rules = o.rules;
  EXPECT_EQ(bytes_of(plan_conversion(te, ExpertLayout::Single, back)), bytes_of(single));
}

TEST(ScaleRules, RuleFilesDeclareScalesAndTheirBlocks) {
  const LayoutRules te = builtin_rules("te");
  const LayoutRules back = parse_rules(rules_to_json(te), "round trip");
  ASSERT_EQ(back.tensors.size(), te.tensors.size());
  EXPECT_EQ(back.tensors[2].scale_of, "{prefix}weight");
  EXPECT_EQ(back.tensors[2].blocks, te.tensors[2].blocks);

  auto parse = [](const std::string& tensors) {
    return parse_rules(
        R"({"name": "q", "tensors": [{"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"],
                    "dims": ["out", "in"]}, )" +
            tensors + "]}",
        "q.json");
  };
  auto bad = [&](const std::string& tensors) { return error_of([&] { parse(tensors); }); };
  const std::string scale =
      R"({"stacked": "{prefix}s", "parts": ["{prefix}s{expert}"], "dims": ["b"], )";
  EXPECT_NO_THROW(
      parse(scale + R"("optional": true, "scale_of": "{prefix}w", "blocks": [[128, 128], []]})"));
  for (const std::string& fields :
       {std::string(R"("optional": true, "scale_of": "{prefix}x", "blocks": [[128, 128]]})"),
        std::string(R"("scale_of": "{prefix}w", "blocks": [[128, 128]]})"),
        std::string(R"("optional": true, "scale_of": "{prefix}w", "blocks": []})"),
        std::string(R"("optional": true, "scale_of": "{prefix}w", "blocks": [[0, 128]]})"),
        std::string(R"("optional": true, "scale_of": "{prefix}w", "blocks": [[128]]})"),
        std::string(R"("optional": true, "scale_of": "{prefix}w", "blocks": ["x"]})"),
        std::string(R"("optional": true, "blocks": [[1, 32]]})")}) {
    const Error e = bad(scale + fields);
    EXPECT_EQ(e.code(), ErrorCode::InvalidRules) << fields << ": " << e.what();
  }
}

// A weight and its scales are paired as the rules declare (scale_of), whatever their names: a
// rule file's scales "{prefix}s{expert}" of "{prefix}w{expert}" dequantize their weights in
// either layout, and are dropped with them.
TEST(ScaleRules, ScalesArePairedByTheirRuleNotTheirName) {
  const LayoutRules q = parse_rules(R"({"name": "q", "tensors": [
      {"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"], "dims": ["out", "in"]},
      {"stacked": "{prefix}s", "parts": ["{prefix}s{expert}"], "dims": ["b"], "optional": true,
       "scale_of": "{prefix}w", "blocks": [[128, 128]]}]})",
                                    "q.json");
  StateDict sd;
  const std::vector<float> codes = {1, 2, 3, 4, 5, 6};
  for (int e = 0; e < 2; ++e) {
    const std::string i = std::to_string(e);
    const std::vector<float> scale = {e + 2.0f};
    sd.insert("m.w" + i, Tensor::from_f32({2, 3}, codes, DType::F8_E4M3));
    sd.insert("m.s" + i, Tensor::from_f32({1, 1}, scale, DType::F32));
  }
  PlanOptions o;
  o.rules = {q};
  for (ExpertLayout target : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
    ConversionPlan plan = plan_conversion(sd, target, o);
    EXPECT_EQ(layout::dequantize_plan(plan.tensors, DType::F32, layout::MissingScales::Refuse),
              target == ExpertLayout::Single ? 1u : 2u);
    ASSERT_EQ(plan.tensors.size(), target == ExpertLayout::Single ? 1u : 2u);
    Tensor values = Tensor::zeros(plan.tensors[0].shape, DType::F32);
    plan.tensors[0].copy_to(values);
    EXPECT_EQ(values.data_as<float>()[5], 6.0f * 2.0f);  // expert 0's last value, its scale 2
  }
}

// Scales of dense FP8 weights that fit no block are reported once each; a scale that belongs to
// an inconsistent candidate is that candidate's problem (GroupedScan::problem_keys), not reported
// again.
TEST(ScaleRules, DenseScaleProblemsAreReportedOnce) {
  StateDict sd;
  sd.insert("a.weight", Tensor::zeros({4, 4}, DType::F8_E4M3));
  sd.insert("a.weight_scale_inv", Tensor::zeros({3, 3}, DType::F32));
  sd.insert("m.weight0", Tensor::zeros({2, 3}, DType::F8_E4M3));
  sd.insert("m.weight1", Tensor::zeros({2, 4}, DType::F8_E4M3));  // experts of two shapes
  sd.insert("m.weight0_scale_inv", Tensor::zeros({5, 5}, DType::F32));
  sd.insert("m.weight1_scale_inv", Tensor::zeros({1, 1}, DType::F32));
  const GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ShapeMismatch) << scan.problems[0].what();
  EXPECT_EQ(scan.problem_keys,
            (std::vector<std::string>{"m.weight0", "m.weight1", "m.weight0_scale_inv",
                                      "m.weight1_scale_inv"}));
  const std::vector<Error> dense = layout::scale_problems(sd, scan);
  ASSERT_EQ(dense.size(), 1u);
  EXPECT_EQ(dense[0].code(), ErrorCode::ScaleShapeMismatch);
  EXPECT_NE(dense[0].message().find("\"a.weight_scale_inv\""), std::string::npos)
      << dense[0].what();
}

}  // namespace
}  // namespace grouplin
