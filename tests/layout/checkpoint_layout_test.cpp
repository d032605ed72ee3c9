// Grouped-module recognition (one test per problem code) and conversion plans.
#include "grouplin/checkpoint_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"
#include "io/moe_checkpoint.hpp"
#include "layout/plan.hpp"

namespace grouplin {
namespace {

using testing::moe_state_dict;
using testing::MoeModuleSpec;

const std::vector<MoeModuleSpec> kModules = {
    {"model.layers.3.mlp.experts.", 4, 3, 5, true, DType::BF16},
    {"model.layers.7.mlp.experts.", 1, 2, 6, false, DType::F32},
};

Tensor f32(const Shape& shape) { return Tensor::zeros(shape, DType::F32); }

// The single problem of a scan of `sd`.
Error only_problem(const StateDict& sd) {
  GroupedScan scan = scan_grouped_modules(sd);
  EXPECT_EQ(scan.problems.size(), 1u);
  EXPECT_TRUE(scan.modules.empty());
  if (scan.problems.empty()) return Error(ErrorCode::InvalidArgument, "no problem");
  return scan.problems.front();
}

TEST(CheckpointLayout, LayoutNames) {
  EXPECT_EQ(layout_name(ExpertLayout::Single), "single");
  EXPECT_EQ(layout_name(ExpertLayout::PerExpert), "per-expert");
  EXPECT_EQ(expert_layout_from_name("single"), ExpertLayout::Single);
  EXPECT_EQ(expert_layout_from_name("per-expert"), ExpertLayout::PerExpert);
  EXPECT_EQ(expert_layout_from_name("Single"), std::nullopt);
}

TEST(CheckpointLayout, FindsModulesOfBothLayouts) {
  for (ExpertLayout layout : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
    const StateDict sd = moe_state_dict(kModules, layout);
    const std::vector<GroupedModule> found = find_grouped_modules(sd);
    ASSERT_EQ(found.size(), 2u);
    EXPECT_EQ(found[0].prefix, "model.layers.3.mlp.experts.");
    EXPECT_EQ(found[0].layout, layout);
    EXPECT_EQ(found[0].num_experts, 4);
    EXPECT_EQ(found[0].out_features, 3);
    EXPECT_EQ(found[0].in_features, 5);
    EXPECT_TRUE(found[0].bias);
    EXPECT_EQ(found[0].dtype, DType::BF16);
    EXPECT_EQ(found[0].bias_dtype, DType::BF16);
    EXPECT_EQ(found[0].keys.size(), layout == ExpertLayout::Single ? 2u : 8u);
    EXPECT_EQ(found[1].num_experts, 1);  // N = 1
    EXPECT_FALSE(found[1].bias);
    EXPECT_EQ(found[1].keys.size(), 1u);
  }
}

TEST(CheckpointLayout, OrdinaryEntriesAreNotModules) {
  StateDict sd;
  sd.insert("fc.weight", f32({3, 5}));  // a linear layer
  sd.insert("fc.bias", f32({3}));
  sd.insert("conv.weight", f32({4, 2, 3}));  // a convolution: rank-1 bias
  sd.insert("conv.bias", f32({4}));
  sd.insert("emb.weight01", f32({3, 5}));  // not a canonical index
  sd.insert("emb.weightx", f32({3, 5}));
  sd.insert("norm.weight", f32({5}));
  sd.insert("lone.bias", f32({2, 3}));  // a rank-2 bias without weight
  GroupedScan scan = scan_grouped_modules(sd);
  EXPECT_TRUE(scan.modules.empty());
  EXPECT_TRUE(scan.problems.empty());
}

TEST(CheckpointLayout, RootPrefix) {
  StateDict sd;
  sd.insert("weight0", f32({2, 3}));
  sd.insert("weight1", f32({2, 3}));
  std::vector<GroupedModule> found = find_grouped_modules(sd);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].prefix, "");
  EXPECT_EQ(found[0].num_experts, 2);
}

TEST(CheckpointLayout, PartialExpertSetMissingWeight) {
  StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert, false);
  sd.erase("model.layers.3.mlp.experts.weight2");
  GroupedScan scan = scan_grouped_modules(sd);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_EQ(scan.modules.size(), 1u);  // the other module is still found
  const Error& e = scan.problems.front();
  EXPECT_EQ(e.code(), ErrorCode::PartialExpertSet);
  EXPECT_NE(e.message().find("\"model.layers.3.mlp.experts.\""), std::string::npos) << e.what();
  EXPECT_NE(e.message().find("weight2"), std::string::npos) << e.what();
  EXPECT_THROW(find_grouped_modules(sd), Error);
}

TEST(CheckpointLayout, PartialExpertSetMissingBias) {
  StateDict sd = moe_state_dict({kModules[0]}, ExpertLayout::PerExpert, false);
  sd.erase("model.layers.3.mlp.experts.bias0");
  Error e = only_problem(sd);
  EXPECT_EQ(e.code(), ErrorCode::PartialExpertSet);
  EXPECT_NE(e.message().find("bias0"), std::string::npos) << e.what();
}

TEST(CheckpointLayout, PartialExpertSetBiasBeyondWeights) {
  StateDict sd;
  sd.insert("m.weight0", f32({2, 3}));
  sd.insert("m.bias0", f32({2}));
  sd.insert("m.bias1", f32({2}));
  EXPECT_EQ(only_problem(sd).code(), ErrorCode::PartialExpertSet);
}

TEST(CheckpointLayout, PartialExpertSetBiasesWithoutWeights) {
  StateDict sd;
  sd.insert("m.bias0", f32({2}));
  EXPECT_EQ(only_problem(sd).code(), ErrorCode::PartialExpertSet);
}

TEST(CheckpointLayout, PartialExpertSetOnlyHighIndex) {
  StateDict sd;
  sd.insert("m.weight999999999", f32({2, 3}));  // the largest index accepted
  Error e = only_problem(sd);
  EXPECT_EQ(e.code(), ErrorCode::PartialExpertSet);
  EXPECT_NE(e.message().find("more"), std::string::npos) << e.what();  // the list is capped
}

TEST(CheckpointLayout, BothLayoutsPresent) {
  StateDict a;
  a.insert("m.weight", f32({2, 2, 3}));
  a.insert("m.weight0", f32({2, 3}));
  EXPECT_EQ(only_problem(a).code(), ErrorCode::BothLayoutsPresent);
  StateDict b;
  b.insert("m.bias0", f32({2}));
  b.insert("m.weight0", f32({2, 3}));
  b.insert("m.bias", f32({1, 2}));
  EXPECT_EQ(only_problem(b).code(), ErrorCode::BothLayoutsPresent);
}

// TransformerEngine chooses the weight's and the bias's layout separately: a single weight beside
// per-expert biases (and the reverse) is one valid module of mixed layout.
TEST(CheckpointLayout, WeightAndBiasMayHaveTheirOwnLayouts) {
  StateDict b;
  b.insert("m.weight0", f32({2, 3}));
  b.insert("m.bias", f32({1, 2}));
  std::vector<GroupedModule> found = find_grouped_modules(b);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].layout, ExpertLayout::PerExpert);
  EXPECT_TRUE(found[0].mixed);
  EXPECT_TRUE(found[0].bias);
  ASSERT_EQ(found[0].tensors.size(), 2u);
  EXPECT_EQ(found[0].tensors[1].name, "m.bias");
  EXPECT_EQ(found[0].tensors[1].layout, ExpertLayout::Single);
  StateDict c;
  c.insert("m.weight", f32({2, 2, 3}));
  c.insert("m.bias0", f32({2}));
  c.insert("m.bias1", f32({2}));
  found = find_grouped_modules(c);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].layout, ExpertLayout::Single);
  EXPECT_TRUE(found[0].mixed);
  // Both convert to one layout.
  for (ExpertLayout to : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
    const ConversionPlan plan = plan_conversion(c, to);
    ASSERT_EQ(plan.tensors.size(), to == ExpertLayout::Single ? 2u : 4u);
    if (to == ExpertLayout::Single) {
      EXPECT_EQ(plan.tensors[1].name, "m.bias");
      EXPECT_EQ(plan.tensors[1].shape, (Shape{2, 2}));
      EXPECT_EQ(plan.tensors[1].pieces.size(), 2u);
    } else {
      EXPECT_EQ(plan.tensors[0].name, "m.weight0");
      EXPECT_EQ(plan.tensors[3].name, "m.bias1");
    }
  }
}

TEST(CheckpointLayout, ShapeMismatchPerExpert) {
  StateDict rank;
  rank.insert("m.weight0", f32({2, 3, 1}));
  EXPECT_EQ(only_problem(rank).code(), ErrorCode::ShapeMismatch);
  StateDict differ;
  differ.insert("m.weight0", f32({2, 3}));
  differ.insert("m.weight1", f32({2, 4}));
  Error e = only_problem(differ);
  EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(e.message().find("[2, 4]"), std::string::npos) << e.what();
  StateDict bias;
  bias.insert("m.weight0", f32({2, 3}));
  bias.insert("m.bias0", f32({3}));
  EXPECT_EQ(only_problem(bias).code(), ErrorCode::ShapeMismatch);
}

// A stacked TE weight is a module beside TE's _extra_state (GroupedLinear writes one too).
TEST(CheckpointLayout, ShapeMismatchSingle) {
  StateDict bias;
  bias.insert("m.weight", f32({4, 2, 3}));
  bias.insert("m.bias", f32({4, 3}));
  bias.insert("m._extra_state", Tensor::zeros({0}, DType::U8));
  Error e = only_problem(bias);
  EXPECT_EQ(e.code(), ErrorCode::ShapeMismatch);
  EXPECT_NE(e.message().find("[4, 2]"), std::string::npos) << e.what();
  StateDict empty;
  empty.insert("m.weight", f32({0, 2, 3}));
  empty.insert("m._extra_state", Tensor::zeros({0}, DType::U8));
  EXPECT_EQ(only_problem(empty).code(), ErrorCode::ShapeMismatch);
}

// Without _extra_state, detected rules take a stacked TE weight only where something tells it
// from a convolution: a stacked bias of the same experts, or the checkpoint's declaration. A
// lone one is reported as unconfirmed, never as a module or a problem.
TEST(CheckpointLayout, StackedTeWeightWithoutExtraState) {
  StateDict alone;
  alone.insert("m.weight", f32({4, 2, 3}));
  GroupedScan scan = scan_grouped_modules(alone);
  EXPECT_TRUE(scan.modules.empty());
  EXPECT_TRUE(scan.problems.empty());
  ASSERT_EQ(scan.unconfirmed.size(), 1u);
  EXPECT_EQ(scan.unconfirmed[0].prefix, "m.");
  EXPECT_EQ(scan.unconfirmed[0].name, "m.weight");
  EXPECT_EQ(scan.unconfirmed[0].needs, "m._extra_state");
  EXPECT_EQ(scan.unconfirmed[0].rules, "te");
  // Named rules take it.
  EXPECT_EQ(find_grouped_modules(alone, {builtin_rules("te")}).size(), 1u);

  StateDict with_bias = alone;
  with_bias.insert("m.bias", f32({4, 2}));
  std::vector<GroupedModule> found = find_grouped_modules(with_bias);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].layout, ExpertLayout::Single);
  EXPECT_EQ(found[0].num_experts, 4);
  EXPECT_TRUE(found[0].bias);
  EXPECT_TRUE(found[0].grouped_linear_names);

  // A bias that disagrees is no evidence, and no problem either.
  StateDict odd_bias = alone;
  odd_bias.insert("m.bias", f32({4, 5}));
  scan = scan_grouped_modules(odd_bias);
  EXPECT_TRUE(scan.modules.empty());
  EXPECT_TRUE(scan.problems.empty());
  ASSERT_EQ(scan.unconfirmed.size(), 1u);
  EXPECT_EQ(scan.unconfirmed[0].name, "m.weight");

  // A convolution with its rank-1 bias is not even a candidate.
  StateDict conv;
  conv.insert("conv1d.weight", f32({8, 1, 4}));
  conv.insert("conv1d.bias", f32({8}));
  scan = scan_grouped_modules(conv);
  EXPECT_TRUE(scan.modules.empty() && scan.problems.empty() && scan.unconfirmed.empty());

  // Declared by the checkpoint: a module.
  PlanOptions declared;
  declared.declared_modules = {"m."};
  ConversionPlan plan = plan_conversion(alone, ExpertLayout::PerExpert, declared);
  ASSERT_EQ(plan.modules.size(), 1u);
  ASSERT_EQ(plan.tensors.size(), 4u);
  EXPECT_EQ(plan.tensors[3].name, "m.weight3");
}

// A conversion that finds nothing but unconfirmed stacks would change nothing: it says why.
TEST(CheckpointLayout, ConversionOfUnconfirmedStacksOnlyIsRefused) {
  StateDict sd;
  sd.insert("model.embed.weight", f32({6, 4}));
  sd.insert("a.weight", f32({4, 2, 3}));
  sd.insert("b.weight", f32({4, 2, 3}));
  for (ExpertLayout target : {ExpertLayout::Single, ExpertLayout::PerExpert}) {
    try {
      plan_conversion(sd, target);
      ADD_FAILURE() << "converted nothing without a word";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::NoGroupedModules);
      for (const char* part : {"\"a.weight\" [4, 2, 3]", "and 1 more", "\"a._extra_state\"",
                               "--rules te", kDeclaredModulesKey}) {
        EXPECT_NE(e.message().find(part), std::string::npos) << part << ": " << e.what();
      }
    }
  }
  // With a module found beside them, they pass through as ordinary entries.
  sd.insert("c.weight0", f32({2, 3}));
  EXPECT_EQ(plan_conversion(sd, ExpertLayout::Single).modules.size(), 1u);
}

// A family GroupLin has no rules for says so, rather than what detection could not confirm.
TEST(CheckpointLayout, AFamilyWithoutRulesSaysSoWhenNothingIsFound) {
  std::string no_rules;
  for (const ModelFamily& f : model_families()) {
    if (f.structure.empty()) no_rules = f.model_type;
  }
  ASSERT_FALSE(no_rules.empty());
  StateDict sd;
  sd.insert("model.layers.0.attn.k_sconv.weight", f32({16, 1, 4}));
  PlanOptions o;
  o.model_type = no_rules;
  try {
    plan_conversion(sd, ExpertLayout::Single, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::NoGroupedModules) << e.what();
    EXPECT_NE(e.message().find("GroupLin has no rules for this family"), std::string::npos)
        << e.what();
  }
}

// Converted to the single layout, a module that detection would not find again (a stacked weight
// alone, without _extra_state) is declared; one with a stacked bias or _extra_state is not.
TEST(CheckpointLayout, PlanDeclaresWhatDetectionWouldMiss) {
  const std::vector<MoeModuleSpec> modules = {{"a.experts.", 4, 3, 5, true, DType::BF16},
                                              {"b.experts.", 2, 2, 6, false, DType::F32}};
  const StateDict bare = moe_state_dict(modules, ExpertLayout::PerExpert, /*extras=*/false);
  ConversionPlan plan = plan_conversion(bare, ExpertLayout::Single);
  EXPECT_EQ(plan.to_declare, std::vector<std::string>{"b.experts."});
  EXPECT_TRUE(plan_conversion(bare, ExpertLayout::PerExpert).to_declare.empty());
  EXPECT_TRUE(
      plan_conversion(moe_state_dict(modules, ExpertLayout::PerExpert), ExpertLayout::Single)
          .to_declare.empty());
  // The single output, seen with its declaration, holds both modules again.
  StateDict single;
  for (const PlannedTensor& t : plan.tensors) {
    Tensor out = Tensor::zeros(t.shape, t.dtype);
    t.copy_to(out);
    single.insert(t.name, out);
  }
  EXPECT_EQ(scan_grouped_modules(single).modules.size(), 1u);
  PlanOptions o;
  o.declared_modules = plan.to_declare;
  ConversionPlan back = plan_conversion(single, ExpertLayout::PerExpert, o);
  ASSERT_EQ(back.modules.size(), 2u);
  ASSERT_EQ(back.tensors.size(), bare.size());
  size_t i = 0;
  for (const auto& [name, t] : bare) {
    const PlannedTensor& p = back.tensors[i++];
    EXPECT_EQ(p.name, name);
    Tensor got = Tensor::zeros(p.shape, p.dtype);
    p.copy_to(got);
    ASSERT_EQ(got.nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(got.data(), t.data(), t.nbytes()), 0) << name;
  }
}

TEST(CheckpointLayout, DeclaredModulesMetadata) {
  std::map<std::string, std::string> md = {{"format", "pt"}};
  md = with_declared_modules(md, {"a.", "b.c."});
  EXPECT_EQ(md.at("format"), "pt");
  EXPECT_EQ(declared_modules(md, "f"), (std::vector<std::string>{"a.", "b.c."}));
  md = with_declared_modules(md, {});
  EXPECT_EQ(md.count(kDeclaredModulesKey), 0u);
  EXPECT_TRUE(declared_modules(md, "f").empty());
  for (const char* bad : {"", "a.", "{\"a.\": 1}", "[1]", "[\"a.\", null]"}) {
    try {
      declared_modules({{kDeclaredModulesKey, bad}}, "\"in.safetensors\"");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidMetadata) << bad;
      EXPECT_NE(e.message().find("in.safetensors"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckpointLayout, DTypeMismatch) {
  StateDict w;
  w.insert("m.weight0", f32({2, 3}));
  w.insert("m.weight1", Tensor::zeros({2, 3}, DType::BF16));
  EXPECT_EQ(only_problem(w).code(), ErrorCode::DTypeMismatch);
  StateDict b;
  b.insert("m.weight0", f32({2, 3}));
  b.insert("m.weight1", f32({2, 3}));
  b.insert("m.bias0", f32({2}));
  b.insert("m.bias1", Tensor::zeros({2}, DType::F16));
  EXPECT_EQ(only_problem(b).code(), ErrorCode::DTypeMismatch);
}

TEST(CheckpointLayout, BiasMayHaveItsOwnDType) {
  StateDict sd;
  sd.insert("m.weight0", Tensor::zeros({2, 3}, DType::BF16));
  sd.insert("m.bias0", f32({2}));
  std::vector<GroupedModule> found = find_grouped_modules(sd);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].dtype, DType::BF16);
  EXPECT_EQ(found[0].bias_dtype, DType::F32);
}

// The plan's tensors, with their pieces' bytes concatenated, equal the target dict exactly.
void expect_plan_is(const ConversionPlan& plan, const StateDict& want) {
  ASSERT_EQ(plan.tensors.size(), want.size());
  size_t i = 0;
  for (const auto& [name, t] : want) {
    const PlannedTensor& p = plan.tensors[i++];
    EXPECT_EQ(p.name, name);
    EXPECT_EQ(p.dtype, t.dtype()) << name;
    EXPECT_EQ(p.shape, t.shape()) << name;
    ASSERT_EQ(p.nbytes(), t.nbytes()) << name;
    std::vector<std::byte> bytes;
    for (const Tensor& piece : p.pieces)
      bytes.insert(bytes.end(), piece.data(), piece.data() + piece.nbytes());
    EXPECT_TRUE(bytes.empty() || std::equal(bytes.begin(), bytes.end(), t.data())) << name;
  }
}

TEST(CheckpointLayout, PlansEveryDirection) {
  for (ExpertLayout from : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
    for (ExpertLayout to : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
      SCOPED_TRACE(std::string(layout_name(from)) + " -> " + std::string(layout_name(to)));
      const StateDict src = moe_state_dict(kModules, from);
      const ConversionPlan plan = plan_conversion(src, to);
      EXPECT_EQ(plan.modules.size(), 2u);
      expect_plan_is(plan, moe_state_dict(kModules, to));
    }
  }
}

TEST(CheckpointLayout, PlanCopiesNothing) {
  const StateDict src = moe_state_dict(kModules, ExpertLayout::Single);
  const detail::StorageStats before = detail::storage_stats();
  const ConversionPlan plan = plan_conversion(src, ExpertLayout::PerExpert);
  EXPECT_EQ(detail::storage_stats().allocations, before.allocations);
  EXPECT_EQ(detail::storage_stats().copied_bytes, before.copied_bytes);
  // Expert 2 of the stacked weight is a view of it.
  const Tensor& stacked = src.at("model.layers.3.mlp.experts.weight");
  auto it = std::find_if(plan.tensors.begin(), plan.tensors.end(), [](const PlannedTensor& t) {
    return t.name == "model.layers.3.mlp.experts.weight2";
  });
  ASSERT_NE(it, plan.tensors.end());
  ASSERT_EQ(it->pieces.size(), 1u);
  EXPECT_EQ(it->pieces[0].storage(), stacked.storage());
  EXPECT_EQ(it->pieces[0].data(), stacked.data() + 2 * 3 * 5 * 2);
}

TEST(CheckpointLayout, PlanThrowsTheFirstProblem) {
  StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert);
  sd.erase("model.layers.3.mlp.experts.bias3");
  try {
    plan_conversion(sd, ExpertLayout::Single);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::PartialExpertSet);
  }
}

}  // namespace
}  // namespace grouplin
