// Module trees: state dict key names and order, dotted prefixes, parameter lookup, add_child
// errors, the base Module's load, and that each module plans its part of a load exactly once,
// whichever module the call starts at.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "grouplin/module_extension.hpp"
#include "grouplin/optimizer.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::gl_options;
using testing::make_gl;

// A module with one parameter and one buffer, loaded by the base Module::plan_load.
class Norm : public Module {
 public:
  Norm() {
    register_parameter("scale", testing::test_tensor({4}, 7));
    register_buffer("running", testing::test_tensor({2}, 8));
  }
};

// A GroupedLinear that counts plan_load calls and remembers the prefixes it was given.
class CountingLinear : public GroupedLinear {
 public:
  using GroupedLinear::GroupedLinear;
  void plan_load(const LoadSource& source, const std::string& prefix, LoadPlan& plan) override {
    prefixes.push_back(prefix);
    GroupedLinear::plan_load(source, prefix, plan);
  }
  std::vector<std::string> prefixes;
};

TEST(ModuleStateDict, GroupedLinearKeysInOrder) {
  using V = std::vector<std::string>;
  EXPECT_EQ(make_gl(gl_options(3, WeightLayout::PerExpert, 1))->state_dict().keys(),
            (V{"weight0", "weight1", "weight2", "bias0", "bias1", "bias2", "_extra_state"}));
  EXPECT_EQ(make_gl(gl_options(3, WeightLayout::Contiguous, 1, false))->state_dict().keys(),
            (V{"weight0", "weight1", "weight2", "_extra_state"}));
  EXPECT_EQ(make_gl(gl_options(3, WeightLayout::Single, 1))->state_dict().keys(),
            (V{"weight", "bias", "_extra_state"}));
  EXPECT_EQ(make_gl(gl_options(12, WeightLayout::Single, 1, false))->state_dict("a.").keys(),
            (V{"a.weight", "a._extra_state"}));
  const StateDict sd = make_gl(gl_options(12, WeightLayout::PerExpert, 1))->state_dict();
  EXPECT_EQ(sd.keys()[10], "weight10");
  EXPECT_EQ(sd.keys()[23], "bias11");
  const Tensor& extra = sd.at("_extra_state");
  EXPECT_EQ(extra.dtype(), DType::U8);
  EXPECT_EQ(extra.shape(), Shape{0});
}

TEST(ModuleStateDict, NestedPrefixesAndOrder) {
  auto root = std::make_shared<Sequential>();
  auto norm = std::make_shared<Norm>();
  auto block = std::make_shared<Sequential>();
  block->add_child("fc1", make_gl(gl_options(2, WeightLayout::Single, 1, false)));
  block->add_child("norm", norm);
  root->add_child("blocks", std::make_shared<Sequential>());
  root->child("blocks").add_child("0", block);
  root->add_child("head", make_gl(gl_options(1, WeightLayout::PerExpert, 2)));
  const std::vector<std::string> want = {"blocks.0.fc1.weight", "blocks.0.fc1._extra_state",
                                         "blocks.0.norm.scale", "blocks.0.norm.running",
                                         "head.weight0",        "head.bias0",
                                         "head._extra_state"};
  EXPECT_EQ(root->state_dict().keys(), want);
  EXPECT_EQ(root->state_dict("model.").keys()[0], "model.blocks.0.fc1.weight");
  EXPECT_EQ(block->state_dict().keys()[0], "fc1.weight");

  // Entries are views of the module's own bytes.
  const StateDict sd = root->state_dict();
  EXPECT_TRUE(sd.at("blocks.0.norm.scale").same_view(norm->parameters()[0].value));
  EXPECT_TRUE(sd.at("blocks.0.norm.running").same_view(norm->buffers()[0].second));

  std::vector<std::string> visited;
  root->for_each_parameter([&](const std::string& name, Parameter&) { visited.push_back(name); });
  EXPECT_EQ(visited, (std::vector<std::string>{"blocks.0.fc1.weight", "blocks.0.norm.scale",
                                               "head.weight0", "head.bias0"}));
}

TEST(ModuleParameter, DottedLookup) {
  testing::Tree t = testing::make_tree(make_gl(gl_options(3, WeightLayout::PerExpert, 1)),
                                       make_gl(gl_options(2, WeightLayout::Single, 2)));
  const Parameter& p = t.root->parameter("decoder.layers.3.mlp.fc1.weight2");
  EXPECT_EQ(&p, &t.fc1->parameters()[2]);
  EXPECT_EQ(p.name, "weight2");
  EXPECT_EQ(&t.layers->parameter("3.mlp.fc2.bias"), &t.fc2->parameters()[1]);
  EXPECT_EQ(&t.fc1->parameter("bias0"), &t.fc1->parameters()[3]);
  for (const char* bad :
       {"decoder.layers.3.mlp.fc1.weight3", "decoder.layers.2.mlp.fc1.weight0", "decoder.layers",
        "decoder.layers.3.mlp.fc1.", "", "weight0", "decoder..layers.3.mlp.fc1.weight0"}) {
    const Error e = testing::expect_error([&] { t.root->parameter(bad); });
    EXPECT_EQ(e.code(), ErrorCode::MissingKey) << bad;
    EXPECT_NE(e.message().find(quote(bad)), std::string::npos) << e.what();
  }
}

TEST(ModuleChildren, AddChildErrors) {
  Sequential m;
  m.add_child("a", std::make_shared<Sequential>());
  const Error dup = testing::expect_error([&] { m.add_child("a", std::make_shared<Norm>()); });
  EXPECT_EQ(dup.code(), ErrorCode::DuplicateName);
  EXPECT_NE(dup.message().find("\"a\""), std::string::npos);
  for (const char* bad : {"", "a.b", "."}) {
    EXPECT_EQ(
        testing::expect_error([&] { m.add_child(bad, std::make_shared<Sequential>()); }).code(),
        ErrorCode::InvalidArgument)
        << bad;
  }
  EXPECT_EQ(testing::expect_error([&] { m.add_child("b", nullptr); }).code(),
            ErrorCode::InvalidArgument);
  ASSERT_EQ(m.children().size(), 1u);  // failed calls added nothing
  EXPECT_EQ(testing::expect_error([&] { m.child("b"); }).code(), ErrorCode::MissingKey);
  m.add_child("b", std::make_shared<Norm>());
  EXPECT_EQ(m.children()[1].first, "b");
  EXPECT_EQ(&m.child("b"), m.children()[1].second.get());
}

// Base Module::plan_load: parameters and buffers load by name, floats convert, assign adopts.
TEST(ModuleLoad, PlainModuleParametersAndBuffers) {
  Norm src, dst;
  StateDict sd;
  sd.insert("scale", testing::test_tensor({4}, 1, DType::BF16));
  sd.insert("running", testing::test_tensor({2}, 2));
  const LoadReport r = dst.load_state_dict(sd);
  EXPECT_TRUE(dst.parameters()[0].value.bit_equal(sd.at("scale").to(DType::F32)));
  EXPECT_TRUE(dst.buffers()[0].second.bit_equal(sd.at("running")));
  ASSERT_EQ(r.dtype_conversions.size(), 1u);
  EXPECT_EQ(r.dtype_conversions[0].key, "scale");
  EXPECT_TRUE(r.layout_conversions.empty());

  const StateDict own = src.state_dict();
  dst.load_state_dict(own, LoadOptions{.assign = true});
  EXPECT_TRUE(dst.parameters()[0].value.same_view(own.at("scale")));
  EXPECT_FALSE(dst.buffers()[0].second.same_view(own.at("running")));  // buffers are copied
  Parameter& p = const_cast<Parameter&>(dst.parameters()[0]);
  ASSERT_FALSE(p.value.writable());
  Tensor& w = writable_value(p);
  EXPECT_FALSE(w.same_view(own.at("scale")));
  EXPECT_TRUE(w.bit_equal(own.at("scale")));
  EXPECT_TRUE(p.value.writable());
}

// Exactly-once planning (the followed library's remap ran twice when the call started at the
// module): one plan_load per module whether the call starts at the root, at an intermediate
// ancestor or at the module, each with its prefix relative to the call.
TEST(ModuleLoad, EachModulePlansExactlyOnce) {
  for (WeightLayout ckpt : testing::kLayouts) {
    SCOPED_TRACE(std::string(layout_name(ckpt)));
    auto fc1 = std::make_shared<CountingLinear>(gl_options(4, WeightLayout::Single, 1));
    auto fc2 = std::make_shared<CountingLinear>(gl_options(2, WeightLayout::PerExpert, 2));
    testing::Tree t = testing::make_tree(fc1, fc2);
    testing::Tree s =
        testing::make_tree(make_gl(gl_options(4, ckpt, 3)), make_gl(gl_options(2, ckpt, 4)));
    const StateDict sd = s.root->state_dict();

    const LoadReport r = t.root->load_state_dict(sd);
    EXPECT_EQ(fc1->prefixes, std::vector<std::string>{testing::kFc1Prefix});
    EXPECT_EQ(fc2->prefixes, std::vector<std::string>{"decoder.layers.3.mlp.fc2."});
    // fc1 (Single) converts per-expert checkpoints, fc2 (PerExpert) stacked ones: one entry.
    EXPECT_EQ(r.layout_conversions.size(), 1u);

    fc1->prefixes.clear();
    fc2->prefixes.clear();
    t.layers->load_state_dict(testing::reprefix(sd, "decoder.layers.", ""));
    EXPECT_EQ(fc1->prefixes, std::vector<std::string>{"3.mlp.fc1."});
    EXPECT_EQ(fc2->prefixes, std::vector<std::string>{"3.mlp.fc2."});

    fc1->prefixes.clear();
    fc2->prefixes.clear();
    const LoadReport self = fc1->load_state_dict(testing::reprefix(sd, testing::kFc1Prefix, ""));
    EXPECT_EQ(fc1->prefixes, std::vector<std::string>{""});
    EXPECT_TRUE(fc2->prefixes.empty());
    EXPECT_EQ(self.layout_conversions.size(), ckpt == WeightLayout::Single ? 0u : 1u);
    testing::expect_same_experts(*s.fc1, *fc1);
    testing::expect_same_experts(*s.fc2, *fc2);
  }
}

}  // namespace
}  // namespace grouplin
