// The model families of transformers as GroupLin's rules: renames applied both ways, the
// stacked-only families in their own orientation (transposed, interleaved, with biases), tensors
// that are not experts left alone, and the defects of issue 19 (each test names the one it pins).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "error_of.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout_rules.hpp"
#include "io/moe_checkpoint.hpp"
#include "layout/key_pattern.hpp"
#include "layout/plan.hpp"
#include "layout/renames.hpp"

namespace grouplin {
namespace {

using testing::pattern_tensor;
using testing::stack;

// The bytes of a planned tensor (pieces gathered, rearranged) as a tensor of its shape.
Tensor materialize(const PlannedTensor& t) {
  Tensor out = Tensor::zeros(t.shape, t.dtype);
  t.copy_to(out);
  return out;
}

std::map<std::string, Tensor> by_name(const ConversionPlan& plan) {
  std::map<std::string, Tensor> out;
  for (const PlannedTensor& t : plan.tensors) {
    EXPECT_TRUE(out.emplace(t.name, materialize(t)).second) << "twice: " << t.name;
  }
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

using testing::error_of;

// Regression: a literal text ending in a digit before {expert} ("fc1{expert}") never matched,
// because the index took every trailing digit.
TEST(ModelFamilies, PatternTextMayEndInADigit) {
  std::string error;
  const auto p = layout::KeyPattern::compile("{prefix}fc1{expert}", true, error);
  ASSERT_TRUE(p) << error;
  auto m = p->match("model.fc112");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->prefix, "model.");
  EXPECT_EQ(m->expert, 12);
  m = p->match("fc10");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->expert, 0);
  EXPECT_FALSE(p->match("model.fc1"));     // no index
  EXPECT_FALSE(p->match("model.fc1012"));  // "012" is not canonical, "fc10" + "12" not the text
  EXPECT_FALSE(p->match("model.xfc13"));   // the prefix must end in '.'
  EXPECT_EQ(p->format("m.", 7), "m.fc17");

  LayoutRules r = parse_rules(
      R"({"name": "fc", "tensors": [{"stacked": "{prefix}fc1", "parts": ["{prefix}fc1{expert}"],
          "dims": ["out", "in"]}]})",
      "inline");
  StateDict sd;
  for (int i = 0; i < 12; ++i)
    sd.insert("m.fc1" + std::to_string(i), pattern_tensor({2, 3}, DType::F32, i));
  const std::vector<GroupedModule> found = find_grouped_modules(sd, {r});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].num_experts, 12);
}

// A rename whose result holds its source changes a key once, however often it is applied, and
// the per-expert direction undoes it; several renames are undone in reverse order.
TEST(ModelFamilies, RenamesAreIdempotentAndReversible) {
  LayoutRules axk1;  // A.X-K1: the MoE output norm moves under mlp.
  axk1.renames = {{"post_mlp_layernorm", "mlp.post_mlp_layernorm"}};
  const std::string hub = "model.layers.0.post_mlp_layernorm.weight";
  const std::string v5 = layout::renamed(hub, axk1, true);
  EXPECT_EQ(v5, "model.layers.0.mlp.post_mlp_layernorm.weight");
  EXPECT_EQ(layout::renamed(v5, axk1, true), v5);
  EXPECT_EQ(layout::renamed(v5, axk1, false), hub);
  EXPECT_EQ(layout::renamed(hub, axk1, false), hub);
  // PhiMoE's router: both renames forward, both undone backward, in reverse order.
  const LayoutRules phimoe = builtin_rules("phimoe");
  const std::string router = "model.layers.0.block_sparse_moe.gate.weight";
  EXPECT_EQ(layout::renamed(router, phimoe, true), "model.layers.0.mlp.router.weight");
  EXPECT_EQ(layout::renamed("model.layers.0.mlp.router.weight", phimoe, false), router);
}

// Regression: a rank-3 "P.weight" without bias (linear attention's conv1d [C, 1, K] of
// Qwen3-Next, LFM2-MoE's conv) was taken for a TE single-layout module and split into
// conv1d.weight0 .. weight{C-1} by a per-expert conversion: silent corruption.
TEST(ModelFamilies, ConvolutionWeightsAreNotExperts) {
  testing::HfSpec spec;
  StateDict sd = testing::hf_state_dict(spec, true);
  sd.insert("model.layers.0.linear_attn.conv1d.weight", pattern_tensor({8, 1, 4}, DType::BF16, 9));
  sd.insert("model.layers.1.conv.conv.weight", pattern_tensor({6, 1, 3}, DType::BF16, 10));
  for (const char* model_type : {"", "qwen3_next"}) {
    SCOPED_TRACE(std::string("model_type ") + model_type);
    PlanOptions o;
    o.model_type = model_type;
    const ConversionPlan plan = plan_conversion(sd, ExpertLayout::PerExpert, o);
    ASSERT_EQ(plan.modules.size(), 2u);  // the experts of both layers, nothing else
    const auto out = by_name(plan);
    ASSERT_TRUE(out.count("model.layers.0.linear_attn.conv1d.weight"));
    EXPECT_TRUE(same_bytes(out.at("model.layers.0.linear_attn.conv1d.weight"),
                           sd.at("model.layers.0.linear_attn.conv1d.weight")));
    EXPECT_TRUE(out.count("model.layers.1.conv.conv.weight"));
    EXPECT_FALSE(out.count("model.layers.0.linear_attn.conv1d.weight0"));
  }
  // A TE checkpoint has _extra_state beside its stacked weight; asked for by name, te needs none.
  StateDict te;
  te.insert("m.weight", pattern_tensor({4, 3, 5}, DType::F32, 1));
  EXPECT_TRUE(scan_grouped_modules(te).modules.empty());
  EXPECT_EQ(scan_grouped_modules(te, {builtin_rules("te")}).modules.size(), 1u);
  te.insert("m._extra_state", Tensor::zeros({0}, DType::U8));
  EXPECT_EQ(scan_grouped_modules(te).modules.size(), 1u);
}

// Regression: "m.weight [4, 8, 16]" beside "m.bias [4, 0]" divided by the bias's zero dim in the
// scan's message (SIGFPE in `grouplin inspect`).
TEST(ModelFamilies, ZeroDimsAreAProblemNotACrash) {
  StateDict sd;
  sd.insert("m.weight", pattern_tensor({4, 8, 16}, DType::F32, 1));
  sd.insert("m.bias", Tensor::zeros({4, 0}, DType::F32));
  sd.insert("m._extra_state", Tensor::zeros({0}, DType::U8));
  const GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.problems[0].code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(scan.problems[0].message().find("expected [4, 8]"), std::string::npos)
      << scan.problems[0].message();
  StateDict zero_rows;
  zero_rows.insert("m.weight", Tensor::zeros({4, 0, 16}, DType::F32));
  zero_rows.insert("m.bias", Tensor::zeros({4, 0}, DType::F32));
  zero_rows.insert("m._extra_state", Tensor::zeros({0}, DType::U8));
  EXPECT_TRUE(scan_grouped_modules(zero_rows).problems.empty());
}

// gpt-oss as transformers holds and saves it: gate_up_proj [N, H, 2I] with gate and up
// interleaved by column, gate_up_proj_bias [N, 2I] interleaved alike, down_proj [N, I, H],
// down_proj_bias [N, H]. Built from per-expert TE weights so that every value is known.
struct GptOss {
  int64_t n = 3, hidden = 4, inter = 2;
  std::vector<Tensor> gate_up, gate_up_bias, down, down_bias;  // TE: [2I, H] gate rows then up
  StateDict hub;

  GptOss() {
    std::vector<Tensor> gu_stored, gub_stored, d_stored;
    for (int64_t e = 0; e < n; ++e) {
      gate_up.push_back(pattern_tensor({2 * inter, hidden}, DType::BF16, 10 + e));
      gate_up_bias.push_back(pattern_tensor({2 * inter}, DType::BF16, 20 + e));
      down.push_back(pattern_tensor({hidden, inter}, DType::BF16, 30 + e));
      down_bias.push_back(pattern_tensor({hidden}, DType::BF16, 40 + e));
      // Stored [H, 2I]: column 2j is gate row j, column 2j+1 up row j.
      Tensor gu = Tensor::zeros({hidden, 2 * inter}, DType::BF16);
      Tensor gub = Tensor::zeros({2 * inter}, DType::BF16);
      for (int64_t j = 0; j < inter; ++j) {
        for (int64_t g = 0; g < 2; ++g) {
          const int64_t row = g * inter + j, col = 2 * j + g;
          for (int64_t h = 0; h < hidden; ++h)
            element(gu, h * 2 * inter + col) = element(gate_up[e], row * hidden + h);
          element(gub, col) = element(gate_up_bias[e], row);
        }
      }
      Tensor d = Tensor::zeros({inter, hidden}, DType::BF16);
      for (int64_t h = 0; h < hidden; ++h) {
        for (int64_t i = 0; i < inter; ++i)
          element(d, i * hidden + h) = element(down[e], h * inter + i);
      }
      gu_stored.push_back(gu);
      gub_stored.push_back(gub);
      d_stored.push_back(d);
    }
    hub.insert("model.embed_tokens.weight", pattern_tensor({5, hidden}, DType::BF16, 1));
    hub.insert("model.layers.0.mlp.router.weight", pattern_tensor({n, hidden}, DType::BF16, 2));
    hub.insert("model.layers.0.mlp.router.bias", pattern_tensor({n}, DType::BF16, 3));
    hub.insert("model.layers.0.mlp.experts.gate_up_proj", stack(gu_stored));
    hub.insert("model.layers.0.mlp.experts.gate_up_proj_bias", stack(gub_stored));
    hub.insert("model.layers.0.mlp.experts.down_proj", stack(d_stored));
    hub.insert("model.layers.0.mlp.experts.down_proj_bias", stack(down_bias));
  }

  static uint16_t& element(Tensor& t, int64_t i) { return t.mutable_data_as<uint16_t>()[i]; }
};

TEST(ModelFamilies, GptOssIsAStackedOnlyModuleInItsOwnOrientation) {
  const GptOss g;
  for (const char* model_type : {"gpt_oss", ""}) {  // config.json, or the bias names alone
    SCOPED_TRACE(std::string("model_type ") + model_type);
    PlanOptions o;
    o.model_type = model_type;
    const ConversionPlan single = plan_conversion(g.hub, ExpertLayout::Single, o);
    ASSERT_EQ(single.modules.size(), 1u);
    const GroupedModule& m = single.modules[0];
    EXPECT_TRUE(m.stacked_only);
    EXPECT_EQ(m.num_experts, 3);
    EXPECT_EQ(m.out_features, 4);  // 2I, the per-expert orientation
    EXPECT_EQ(m.in_features, 4);
    EXPECT_TRUE(m.bias);
    ASSERT_EQ(m.tensors.size(), 4u);
    EXPECT_TRUE(m.tensors[0].transposed);
    EXPECT_EQ(m.tensors[0].interleave, 2);
    EXPECT_EQ(m.tensors[2].expert_shape, (Shape{4, 2}));  // down [H, I]
    // --layout single keeps it byte for byte.
    const auto out = by_name(single);
    ASSERT_EQ(out.size(), g.hub.size());
    for (const auto& [name, t] : g.hub) EXPECT_TRUE(same_bytes(out.at(name), t)) << name;

    // Per-expert: TE names only when asked for; otherwise a named refusal.
    const Error e = error_of([&] { plan_conversion(g.hub, ExpertLayout::PerExpert, o); });
    EXPECT_EQ(e.code(), ErrorCode::NoPerExpertForm) << e.what();
    EXPECT_NE(e.message().find("model.layers.0.mlp.experts."), std::string::npos) << e.what();
  }
  PlanOptions te;
  te.rules = {builtin_rules("gpt_oss"), builtin_rules("te")};
  const ConversionPlan per_expert = plan_conversion(g.hub, ExpertLayout::PerExpert, te);
  const auto out = by_name(per_expert);
  const std::string p = "model.layers.0.mlp.experts.";
  for (int64_t e = 0; e < g.n; ++e) {
    const std::string i = std::to_string(e);
    EXPECT_TRUE(same_bytes(out.at(p + "gate_up_proj.weight" + i), g.gate_up[e])) << e;
    EXPECT_TRUE(same_bytes(out.at(p + "gate_up_proj.bias" + i), g.gate_up_bias[e])) << e;
    EXPECT_TRUE(same_bytes(out.at(p + "down_proj.weight" + i), g.down[e])) << e;
    EXPECT_TRUE(same_bytes(out.at(p + "down_proj.bias" + i), g.down_bias[e])) << e;
  }
  EXPECT_TRUE(out.count("model.layers.0.mlp.router.weight"));

  // And back: the TE form, with config.json's model type, is gpt-oss's own bytes again.
  StateDict te_dict;
  for (const auto& [name, t] : out) te_dict.insert(name, t);
  PlanOptions back;
  back.model_type = "gpt_oss";
  const auto restored = by_name(plan_conversion(te_dict, ExpertLayout::Single, back));
  ASSERT_EQ(restored.size(), g.hub.size());
  for (const auto& [name, t] : g.hub) EXPECT_TRUE(same_bytes(restored.at(name), t)) << name;

  // "te" alone, config.json naming the family, asks the same.
  PlanOptions te_alone;
  te_alone.rules = {builtin_rules("te")};
  te_alone.model_type = "gpt_oss";
  EXPECT_EQ(plan_conversion(g.hub, ExpertLayout::PerExpert, te_alone).tensors.size(),
            per_expert.tensors.size());

  // What te asks for is a property of the set, not its name: te's JSON form under another name
  // asks the same; without the property it is a set of its own, which matches nothing here.
  LayoutRules mine = parse_rules(rules_to_json(builtin_rules("te")), "mine.json");
  EXPECT_TRUE(mine.grouped_linear_names);
  mine.name = "my-te";
  te_alone.rules = {mine};
  EXPECT_EQ(plan_conversion(g.hub, ExpertLayout::PerExpert, te_alone).tensors.size(),
            per_expert.tensors.size());
  mine.grouped_linear_names = false;
  te.rules = {builtin_rules("gpt_oss"), mine};
  EXPECT_EQ(error_of([&] { plan_conversion(g.hub, ExpertLayout::PerExpert, te); }).code(),
            ErrorCode::RuleMatchedNothing);
}

// Llama 4 stores gate_up_proj [N, H, 2I] and down_proj [N, I, H] (transposed, not interleaved);
// without config.json the shapes tell its orientation from the hf form's.
TEST(ModelFamilies, Llama4OrientationFromShapes) {
  StateDict sd;
  sd.insert("model.layers.0.feed_forward.experts.gate_up_proj",
            pattern_tensor({2, 6, 8}, DType::F32, 1));
  sd.insert("model.layers.0.feed_forward.experts.down_proj",
            pattern_tensor({2, 4, 6}, DType::F32, 2));
  const GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_TRUE(scan.problems.empty()) << scan.problems[0].what();
  ASSERT_EQ(scan.modules.size(), 1u);
  EXPECT_EQ(scan.modules[0].rules, "stacked-transposed");
  EXPECT_EQ(scan.modules[0].out_features, 8);
  EXPECT_EQ(scan.modules[0].in_features, 6);
  PlanOptions te;
  te.rules = {builtin_rules("llama4_text"), builtin_rules("te")};
  const auto out = by_name(plan_conversion(sd, ExpertLayout::PerExpert, te));
  const Tensor& w = out.at("model.layers.0.feed_forward.experts.gate_up_proj.weight1");
  ASSERT_EQ(w.shape(), (Shape{8, 6}));
  const float* src = reinterpret_cast<const float*>(
      sd.at("model.layers.0.feed_forward.experts.gate_up_proj").data());
  const float* dst = reinterpret_cast<const float*>(w.data());
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 6; ++c) EXPECT_EQ(dst[r * 6 + c], src[48 + c * 8 + r]) << r << "," << c;
  }
}

// GraniteMoE's Hub form is stacked under other names (input_linear.weight, output_linear.weight);
// transformers v5 renames them (experts.gate_up_proj, experts.down_proj) and its router.
TEST(ModelFamilies, GraniteHubAndV5FormsAreOneModel) {
  StateDict hub, v5;
  const Tensor in = pattern_tensor({3, 8, 6}, DType::F32, 1),
               out = pattern_tensor({3, 6, 4}, DType::F32, 2);
  const Tensor router = pattern_tensor({3, 6}, DType::F32, 3);
  hub.insert("model.layers.0.block_sparse_moe.input_linear.weight", in);
  hub.insert("model.layers.0.block_sparse_moe.output_linear.weight", out);
  hub.insert("model.layers.0.block_sparse_moe.router.layer.weight", router);
  v5.insert("model.layers.0.block_sparse_moe.experts.gate_up_proj", in);
  v5.insert("model.layers.0.block_sparse_moe.experts.down_proj", out);
  v5.insert("model.layers.0.block_sparse_moe.router.weight", router);
  PlanOptions o;
  o.model_type = "granitemoe";
  for (const StateDict* sd : {&hub, &v5}) {
    const ConversionPlan single = plan_conversion(*sd, ExpertLayout::Single, o);
    ASSERT_EQ(single.modules.size(), 1u);
    EXPECT_TRUE(single.modules[0].stacked_only);
    const auto got = by_name(single);
    ASSERT_EQ(got.size(), 3u);
    for (const auto& [name, t] : v5) EXPECT_TRUE(same_bytes(got.at(name), t)) << name;
    // The form verify compares: the same names and bytes from both.
    const auto compared = by_name(layout::plan(*sd, layout::Target::Compare, o));
    EXPECT_EQ(compared.size(), 3u);
    for (const auto& [name, t] : v5) EXPECT_TRUE(same_bytes(compared.at(name), t)) << name;
    EXPECT_EQ(error_of([&] { plan_conversion(*sd, ExpertLayout::PerExpert, o); }).code(),
              ErrorCode::NoPerExpertForm);
  }
}

// Ergo's Hub form is stacked, without a gate, each expert stored [in, out] (up_proj [N, H, I],
// down_proj [N, I, H]), under other names and without the "model." prefix: transformers v5 renames
// every key. Its router is stored [H, N] too, a tensor that is not an expert: renamed only.
TEST(ModelFamilies, ErgoHubFormIsStackedTransposedWithoutAGate) {
  StateDict hub;
  const Tensor up = pattern_tensor({3, 6, 4}, DType::F32, 1),
               down = pattern_tensor({3, 4, 6}, DType::F32, 2);
  const Tensor router = pattern_tensor({6, 3}, DType::F32, 3);
  hub.insert("layers.1.feed_forward.up_proj", up);
  hub.insert("layers.1.feed_forward.down_proj", down);
  hub.insert("layers.1.feed_forward.gate_kernel", router);
  hub.insert("layers.1.attention.wqkv.weight", pattern_tensor({12, 6}, DType::F32, 4));
  hub.insert("tok_embeddings.weight", pattern_tensor({5, 6}, DType::F32, 5));
  PlanOptions o;
  o.model_type = "ergo";
  const ConversionPlan single = plan_conversion(hub, ExpertLayout::Single, o);
  ASSERT_EQ(single.modules.size(), 1u);
  EXPECT_TRUE(single.modules[0].stacked_only);
  EXPECT_EQ(single.modules[0].out_features, 4);  // up: I rows of H
  EXPECT_EQ(single.modules[0].in_features, 6);
  const auto got = by_name(single);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_TRUE(same_bytes(got.at("model.layers.1.mlp.experts.up_proj"), up));
  EXPECT_TRUE(same_bytes(got.at("model.layers.1.mlp.experts.down_proj"), down));
  EXPECT_TRUE(same_bytes(got.at("model.layers.1.feed_forward.gate_kernel"), router));
  EXPECT_TRUE(got.count("model.layers.1.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(got.count("model.embed_tokens.weight"));
  EXPECT_EQ(error_of([&] { plan_conversion(hub, ExpertLayout::PerExpert, o); }).code(),
            ErrorCode::NoPerExpertForm);

  // TE's per-expert form turns each expert back to [out, in].
  PlanOptions te;
  te.rules = {builtin_rules("ergo"), builtin_rules("te")};
  const auto per_expert = by_name(plan_conversion(hub, ExpertLayout::PerExpert, te));
  const Tensor& w = per_expert.at("model.layers.1.mlp.experts.up_proj.weight2");
  ASSERT_EQ(w.shape(), (Shape{4, 6}));
  const float* src = reinterpret_cast<const float*>(up.data()) + 2 * 24;
  const float* dst = reinterpret_cast<const float*>(w.data());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) EXPECT_EQ(dst[r * 6 + c], src[c * 4 + r]) << r << "," << c;
  }
}

// Regression: verify of a Hub-form and a v5-form save of one Ernie-4.5-MoE model reported the
// router's correction bias "only in A/B": the family's rename was not applied.
TEST(ModelFamilies, FamilyRenamesMakeHubAndV5FormsTheSame) {
  testing::HfSpec spec;
  StateDict hub = testing::hf_state_dict(spec, false), v5 = testing::hf_state_dict(spec, true);
  hub.insert("model.layers.0.mlp.moe_statics.e_score_correction_bias",
             pattern_tensor({1, 4}, DType::F32, 7));
  v5.insert("model.layers.0.mlp.gate.moe_statics.e_score_correction_bias",
            pattern_tensor({1, 4}, DType::F32, 7));
  PlanOptions o;
  o.model_type = "ernie4_5_moe";
  const auto a = by_name(layout::plan(hub, layout::Target::Compare, o));
  const auto b = by_name(layout::plan(v5, layout::Target::Compare, o));
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(same_bytes(t, b.at(name))) << name;
  }
  const auto fused = by_name(plan_conversion(hub, ExpertLayout::Single, o));
  EXPECT_TRUE(fused.count("model.layers.0.mlp.gate.moe_statics.e_score_correction_bias"));
}

// MiniMax-M2's Hub form is Mixtral's (block_sparse_moe.experts.E.w1/w3/w2), not Qwen's.
TEST(ModelFamilies, MinimaxM2WritesMixtralNames) {
  testing::HfSpec spec;
  spec.family = "mixtral";
  const StateDict v5 = testing::hf_state_dict(spec, true);
  PlanOptions o;
  o.model_type = "minimax_m2";
  const auto out = by_name(plan_conversion(v5, ExpertLayout::PerExpert, o));
  EXPECT_TRUE(out.count("model.layers.0.block_sparse_moe.experts.0.w1.weight"));
  EXPECT_TRUE(out.count("model.layers.0.block_sparse_moe.gate.weight"));
  EXPECT_FALSE(out.count("model.layers.0.mlp.experts.0.gate_proj.weight"));
}

// DBRX folds its experts into dim 0 (w1, v1 [N * I, H]; w2 [N * I, H], each expert's down
// projection transposed); the router beside them tells N.
TEST(ModelFamilies, DbrxFoldedExpertsCountedByTheirRouter) {
  const int64_t n = 3, inter = 2, hidden = 4;
  StateDict sd;
  const std::string p = "transformer.blocks.0.ffn.";
  sd.insert(p + "experts.mlp.w1", pattern_tensor({n * inter, hidden}, DType::F32, 1));
  sd.insert(p + "experts.mlp.v1", pattern_tensor({n * inter, hidden}, DType::F32, 2));
  sd.insert(p + "experts.mlp.w2", pattern_tensor({n * inter, hidden}, DType::F32, 3));
  sd.insert(p + "router.layer.weight", pattern_tensor({n, hidden}, DType::F32, 4));
  PlanOptions o;
  o.model_type = "dbrx";
  const GroupedScan scan = layout::scan(sd, o);
  ASSERT_TRUE(scan.problems.empty()) << scan.problems[0].what();
  ASSERT_EQ(scan.modules.size(), 1u);
  EXPECT_EQ(scan.modules[0].prefix, p);
  EXPECT_EQ(scan.modules[0].num_experts, n);
  EXPECT_TRUE(scan.modules[0].tensors[2].folded && scan.modules[0].tensors[2].transposed);
  EXPECT_EQ(scan.modules[0].tensors[2].expert_shape, (Shape{hidden, inter}));

  PlanOptions te = o;
  te.rules = {builtin_rules("te")};
  const auto out = by_name(plan_conversion(sd, ExpertLayout::PerExpert, te));
  const Tensor& down1 = out.at(p + "experts.mlp.w2.weight1");
  ASSERT_EQ(down1.shape(), (Shape{hidden, inter}));
  const float* w2 = reinterpret_cast<const float*>(sd.at(p + "experts.mlp.w2").data());
  const float* d = reinterpret_cast<const float*>(down1.data());
  for (int64_t h = 0; h < hidden; ++h) {
    for (int64_t i = 0; i < inter; ++i) EXPECT_EQ(d[h * inter + i], w2[(inter + i) * hidden + h]);
  }
  EXPECT_TRUE(
      same_bytes(out.at(p + "experts.mlp.w1.weight2"), sd.at(p + "experts.mlp.w1").rows(4, 2)));
  StateDict te_dict;
  for (const auto& [name, t] : out) te_dict.insert(name, t);
  const auto back = by_name(plan_conversion(te_dict, ExpertLayout::Single, o));
  for (const auto& [name, t] : sd) EXPECT_TRUE(same_bytes(back.at(name), t)) << name;

  // Without its router the count is unknown: no module (ordinary entries), or, named, a problem.
  StateDict alone = sd;
  ASSERT_TRUE(alone.erase(p + "router.layer.weight"));
  EXPECT_TRUE(layout::scan(alone, o).modules.empty());
  PlanOptions named;
  named.rules = {builtin_rules("dbrx")};
  EXPECT_EQ(layout::scan(alone, named).problems.at(0).code(), ErrorCode::PartialExpertSet);
  StateDict uneven = sd;
  uneven.set(p + "router.layer.weight",
             pattern_tensor({4, hidden}, DType::F32, 4));  // 6 rows, 4 experts
  EXPECT_EQ(layout::scan(uneven, o).problems.at(0).code(), ErrorCode::ShapeMismatch);
}

// Regression: verify of hy_v4's two forms differed in model.hc_pre.hc_head.*, because renames
// were scoped below "model." for every family; hy_v4's renames see whole keys, DeepSeek-V4's
// ".norm." -> ".kv_norm." still leaves the base model's own norm alone.
TEST(ModelFamilies, RenameScopeIsTheFamilys) {
  const LayoutRules hy = builtin_rules("hy_v4");
  EXPECT_EQ(hy.renames_after, "");
  EXPECT_EQ(layout::renamed("model.hc_pre.hc_head.hc_head_base", hy, true),
            "model.hc_head.hc_base");
  const LayoutRules ds = builtin_rules("deepseek_v4");
  EXPECT_EQ(ds.renames_after, "model.");
  EXPECT_EQ(layout::renamed("model.norm.weight", ds, true), "model.norm.weight");
  EXPECT_EQ(layout::renamed("model.layers.0.self_attn.norm.weight", ds, true),
            "model.layers.0.self_attn.kv_norm.weight");
}

// The families whose two forms join tensors that are not experts say so as joins verify follows.
TEST(ModelFamilies, NonExpertConcatenationsAreJoins) {
  for (const char* type : {"bailing_hybrid", "kimi_linear", "sarvam_moe", "lara_mini"}) {
    SCOPED_TRACE(type);
    const LayoutRules r = builtin_rules(type);
    ASSERT_EQ(r.joins.size(), 1u);
    EXPECT_GE(r.joins[0].parts.size(), 3u);
  }
  EXPECT_TRUE(builtin_rules("qwen3_moe").joins.empty());
}

// Every model type of the table with a structure builds a valid rule set named after it, whose
// JSON form reads back equal; the families without one say why.
TEST(ModelFamilies, TableIsWellFormed) {
  size_t with_rules = 0;
  for (const ModelFamily& f : model_families()) {
    SCOPED_TRACE(f.model_type);
    if (f.structure.empty()) {
      EXPECT_FALSE(f.not_applied.empty());
      EXPECT_EQ(rules_for_model_type(f.model_type), std::nullopt);
      EXPECT_EQ(error_of([&] { builtin_rules(f.model_type); }).code(), ErrorCode::InvalidArgument);
      continue;
    }
    ++with_rules;
    EXPECT_EQ(rules_for_model_type(f.model_type), f.model_type);
    const LayoutRules r = builtin_rules(f.model_type);
    EXPECT_EQ(r.name, f.model_type);
    const LayoutRules back = parse_rules(rules_to_json(r), "round trip");
    EXPECT_EQ(rules_to_json(back), rules_to_json(r));
  }
  EXPECT_GE(with_rules, 50u);
}

}  // namespace
}  // namespace grouplin
