// Hugging Face checkpoints load straight into GroupedLinears: the experts module of a layer is a
// GroupedLinear `gate_up_proj` (out = 2I) and a GroupedLinear `down_proj`, as transformers v5
// fuses them; module lists and fused tensors, Qwen and Mixtral names, every module layout, and
// expert slices that read only their experts' bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/storage_stats.hpp"
#include "grouplin/grouplin.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/sharded_dir.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::hf_state_dict;
using testing::HfSpec;

constexpr int64_t kHidden = 6, kInter = 4;

struct Experts {
  std::shared_ptr<Sequential> root = std::make_shared<Sequential>();
  std::shared_ptr<GroupedLinear> gate_up, down;
};

Experts make_experts(WeightLayout layout, int64_t n) {
  Experts x;
  GroupedLinearOptions o;
  o.num_gemms = n;
  o.bias = false;
  o.params_dtype = DType::BF16;
  o.weight_layout = layout;
  o.in_features = kHidden;
  o.out_features = 2 * kInter;
  x.gate_up = std::make_shared<GroupedLinear>(o);
  o.in_features = kInter;
  o.out_features = kHidden;
  o.seed = 1;
  x.down = std::make_shared<GroupedLinear>(o);
  x.root->add_child("gate_up_proj", x.gate_up);
  x.root->add_child("down_proj", x.down);
  return x;
}

// The experts [begin, begin + n) of layer `layer` hold the checkpoint's values.
void expect_experts(const Experts& x, int64_t layer, int64_t begin, const HfSpec& spec) {
  const StateDict fused = hf_state_dict(spec, true);
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
  for (int64_t e = 0; e < x.gate_up->num_gemms(); ++e) {
    EXPECT_TRUE(
        x.gate_up->expert_weight(e).bit_equal(fused.at(p + "gate_up_proj").select(begin + e)))
        << "gate_up of expert " << e;
    EXPECT_TRUE(x.down->expert_weight(e).bit_equal(fused.at(p + "down_proj").select(begin + e)))
        << "down of expert " << e;
  }
}

TEST(LoadHuggingFace, ModuleListsAndFusedExpertsLoadIntoGroupedLinears) {
  for (const char* family : {"qwen", "mixtral"}) {
    for (bool fused : {false, true}) {
      for (WeightLayout l : testing::kLayouts) {
        SCOPED_TRACE(std::string(family) + (fused ? " fused -> " : " module list -> ") +
                     std::string(layout_name(l)));
        const HfSpec spec{.family = family};
        const StateDict sd = hf_state_dict(spec, fused);
        Experts x = make_experts(l, 4);
        LoadOptions o;
        o.prefix = "model.layers.1.mlp.experts.";
        if (fused && std::string(family) == "mixtral") o.rules = {builtin_rules("hf-mixtral")};
        const LoadReport r = x.root->load_state_dict(sd, o);
        expect_experts(x, 1, 0, spec);
        EXPECT_TRUE(r.missing.empty());
        EXPECT_TRUE(r.unexpected.empty());
        EXPECT_EQ(r.absent.size(), 2u);  // the _extra_state of both
      }
    }
  }
}

// A whole model: every layer's experts, the rest of the model reported as unexpected.
TEST(LoadHuggingFace, AWholeModelTreeLoadsEveryLayer) {
  const HfSpec spec;
  auto model = std::make_shared<Sequential>();
  auto layers = std::make_shared<Sequential>();
  std::vector<Experts> xs;
  for (int64_t layer = 0; layer < 2; ++layer) {
    xs.push_back(make_experts(WeightLayout::Single, 4));
    auto mlp = std::make_shared<Sequential>();
    mlp->add_child("experts", xs.back().root);
    auto block = std::make_shared<Sequential>();
    block->add_child("mlp", mlp);
    layers->add_child(std::to_string(layer), block);
  }
  auto inner = std::make_shared<Sequential>();
  inner->add_child("layers", layers);
  model->add_child("model", inner);
  const LoadReport r = model->load_state_dict(hf_state_dict(spec, false), {.strict = false});
  for (int64_t layer = 0; layer < 2; ++layer) expect_experts(xs[layer], layer, 0, spec);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_EQ(r.unexpected.size(), 2u + 2 * 3);  // embed, lm_head; per layer q_proj, gate, norm
}

// One rank of an expert-parallel job loads experts [2, 4) of a 4-expert checkpoint: modules of 2
// experts, in any layout, from either form, reading only those experts' bytes.
TEST(LoadHuggingFace, ExpertSlicesReadOnlyTheirExperts) {
  const HfSpec spec;
  const uint64_t slice_bytes = 2 * (2 * kInter * kHidden + kHidden * kInter) * 2;  // BF16
  for (bool fused : {false, true}) {
    for (WeightLayout l : testing::kLayouts) {
      SCOPED_TRACE(std::string(fused ? "fused -> " : "module list -> ") +
                   std::string(layout_name(l)));
      const StateDict sd = hf_state_dict(spec, fused);
      Experts x = make_experts(l, 2);
      LoadOptions o;
      o.prefix = "model.layers.0.mlp.experts.";
      o.experts = ExpertRange{2, 4};
      const uint64_t before = detail::storage_stats().copied_bytes;
      x.root->load_state_dict(sd, o);
      EXPECT_EQ(detail::storage_stats().copied_bytes - before, slice_bytes);
      expect_experts(x, 0, 2, spec);
    }
  }
  // The same for TransformerEngine names: a 4-expert checkpoint into a 2-expert module.
  auto full = testing::make_gl(testing::gl_options(4, WeightLayout::PerExpert, 3));
  auto half = testing::make_gl(testing::gl_options(2, WeightLayout::Contiguous, 4));
  half->load_state_dict(full->state_dict(), {.experts = ExpertRange{1, 3}});
  for (int64_t e = 0; e < 2; ++e) {
    EXPECT_TRUE(half->expert_weight(e).bit_equal(full->expert_weight(e + 1)));
    EXPECT_TRUE(half->expert_bias(e).bit_equal(full->expert_bias(e + 1)));
  }
}

// A downloaded model: a directory of shards, each expert's tensors in different shards, read by
// load_checkpoint as one mapped dict and loaded into GroupedLinears in every layout.
TEST(LoadHuggingFace, AShardedDirectoryLoadsIntoGroupedLinears) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("grouplin_load_dir_" + std::to_string(::getpid()));
  for (const char* family : {"qwen", "mixtral"}) {
    for (bool fused : {false, true}) {
      SCOPED_TRACE(std::string(family) + (fused ? " fused" : " module lists"));
      std::filesystem::remove_all(dir);
      const HfSpec spec{.family = family};
      testing::write_sharded(
          dir, hf_state_dict(spec, fused),
          {.model_type = std::string(family) == "mixtral" ? "mixtral" : "qwen3_moe"});
      const Checkpoint c = load_checkpoint(dir.string());
      for (WeightLayout l : testing::kLayouts) {
        Experts x = make_experts(l, 4);
        LoadOptions o;
        o.prefix = "model.layers.0.mlp.experts.";
        o.model_type = c.model_type;
        const LoadReport r = x.root->load_state_dict(c.tensors, o);
        expect_experts(x, 0, 0, spec);
        EXPECT_TRUE(r.missing.empty());
      }
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace grouplin
