// The built-in rule structures, and the set of a model family: its structure plus its renames
// (include/grouplin/layout_rules.hpp). The families themselves are data: model_families.cpp.
#include <algorithm>
#include <map>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout_rules.hpp"
#include "layout/compiled_rules.hpp"

namespace grouplin {
namespace {

constexpr const char* kStructures[] = {"te",
                                       "hf",
                                       "hf-w1w3",
                                       "hf-mixtral",
                                       "hf-fc",
                                       "hf-up-down",
                                       "stacked",
                                       "stacked-transposed",
                                       "stacked-transposed-up-down",
                                       "gpt-oss",
                                       "stacked-linear",
                                       "folded"};

std::string per_expert_name(std::string_view proj, std::string_view leaf) {
  std::string p = "{prefix}{expert}.";
  p += proj;
  p += '.';
  p += leaf;
  return p;
}

// transformers v5 fused experts: gate and up concatenated, down alone, FP8 scales alike. An empty
// `gate` is a family without one (up and down only).
LayoutRules fused_module_lists(std::string name, std::string_view gate, std::string_view up,
                               std::string_view down) {
  LayoutRules r;
  r.name = std::move(name);
  r.expert_major = true;
  r.prefix_ends_with = "experts.";
  const std::string first = gate.empty() ? "{prefix}up_proj" : "{prefix}gate_up_proj";
  std::vector<std::string> weights, scales;
  if (!gate.empty()) {
    weights.push_back(per_expert_name(gate, "weight"));
    scales.push_back(per_expert_name(gate, "weight_scale_inv"));
  }
  weights.push_back(per_expert_name(up, "weight"));
  scales.push_back(per_expert_name(up, "weight_scale_inv"));
  StackedTensorRule first_scales{
      first + "_scale_inv", scales, {"inter_blocks", "hidden_blocks"}, true};
  StackedTensorRule down_scales{"{prefix}down_proj_scale_inv",
                                {per_expert_name(down, "weight_scale_inv")},
                                {"hidden_blocks", "inter_blocks"},
                                true};
  first_scales.scale_of = first;
  down_scales.scale_of = "{prefix}down_proj";
  first_scales.blocks = down_scales.blocks = {{128, 128}};  // DeepSeek-V3's, Qwen3-FP8's
  r.tensors = {
      {first, weights, {"inter", "hidden"}},
      {"{prefix}down_proj", {per_expert_name(down, "weight")}, {"hidden", "inter"}},
      first_scales,
      down_scales,
  };
  return r;
}

// A stacked tensor whose only per-expert form is TransformerEngine's: "{prefix}gate_up_proj" and
// "{prefix}gate_up_proj.weight{expert}" (the weights of a GroupedLinear at P.gate_up_proj).
StackedTensorRule te_named(const std::string& name, std::vector<std::string> dims) {
  return {"{prefix}" + name, {"{prefix}" + name + ".weight{expert}"}, std::move(dims)};
}

// The FP8 scales of stacked tensor `weight` of a stacked-only family: P.weight_scale_inv
// [N, ...] and, per expert, TransformerEngine's P.weight.weight{i}_scale_inv.
StackedTensorRule te_named_scales(const std::string& weight) {
  StackedTensorRule s{"{prefix}" + weight + "_scale_inv",
                      {"{prefix}" + weight + ".weight{expert}_scale_inv"},
                      {"blocks"},
                      true};
  s.scale_of = "{prefix}" + weight;
  s.blocks = core::fp8_scale_blocks();
  return s;
}

// Experts stacked on the Hub already (gate_up_proj [N, 2I, H], down_proj [N, H, I], or both
// transposed; without a gate, up_proj [N, I, H]): their only per-expert names are
// TransformerEngine's, one GroupedLinear per projection (P.gate_up_proj.weight{i} [2I, H]). Stored
// in the per-expert orientation, their FP8 scales follow them (a transposed weight's scales have
// no agreed orientation: they pass through).
LayoutRules stacked_only(std::string name, bool transposed, bool gated = true) {
  LayoutRules r;
  r.name = std::move(name);
  r.per_expert = PerExpertForm::TeOnly;
  r.prefix_ends_with = "experts.";
  const std::string first = gated ? "gate_up_proj" : "up_proj";
  StackedTensorRule gate_up = te_named(first, {gated ? "gate_up" : "inter", "hidden"});
  StackedTensorRule down = te_named("down_proj", {"hidden", "inter"});
  gate_up.transposed = down.transposed = transposed;
  r.tensors = {gate_up, down};
  if (!transposed) {
    r.tensors.push_back(te_named_scales(first));
    r.tensors.push_back(te_named_scales("down_proj"));
  }
  return r;
}

// gpt-oss: stored [N, H, 2I] with gate and up interleaved by column, and expert biases.
LayoutRules gpt_oss() {
  LayoutRules r = stacked_only("gpt-oss", true);
  r.tensors[0].interleave = 2;
  StackedTensorRule gate_up_bias{
      "{prefix}gate_up_proj_bias", {"{prefix}gate_up_proj.bias{expert}"}, {"gate_up"}, true};
  gate_up_bias.interleave = 2;
  StackedTensorRule down_bias{
      "{prefix}down_proj_bias", {"{prefix}down_proj.bias{expert}"}, {"hidden"}, true};
  r.tensors = {r.tensors[0], gate_up_bias, r.tensors[1], down_bias};
  return r;
}

// JetMoE: each projection stacked as TE's single layout would name it, [N, out, in]
// (P.input_linear.weight [N, 2I, H], P.output_linear.weight [N, H, I]) but without TE's
// _extra_state; its per-expert form is TE's P.input_linear.weight{i}.
LayoutRules stacked_linear() {
  LayoutRules r;
  r.name = "stacked-linear";
  r.per_expert = PerExpertForm::TeOnly;
  r.tensors = {
      {"{prefix}input_linear.weight",
       {"{prefix}input_linear.weight{expert}"},
       {"gate_up", "hidden"}},
      {"{prefix}output_linear.weight",
       {"{prefix}output_linear.weight{expert}"},
       {"hidden", "inter"}},
  };
  return r;
}

// DBRX: each projection stacked with the experts folded into dim 0 (w1, v1 [N * I, H]; w2 the
// same, each expert's down projection transposed), under the feed-forward block, whose router
// (P.router.layer.weight [N, H]) tells N.
LayoutRules folded() {
  LayoutRules r;
  r.name = "folded";
  r.per_expert = PerExpertForm::TeOnly;
  r.experts_from = "{prefix}router.layer.weight";
  StackedTensorRule w1 = te_named("experts.mlp.w1", {"inter", "hidden"});
  StackedTensorRule v1 = te_named("experts.mlp.v1", {"inter", "hidden"});
  StackedTensorRule w2 = te_named("experts.mlp.w2", {"hidden", "inter"});
  w1.folded = v1.folded = w2.folded = true;
  w2.transposed = true;
  r.tensors = {w1, v1, w2};
  return r;
}

LayoutRules structure(std::string_view name) {
  if (name == "te") {
    LayoutRules r;
    r.name = "te";
    StackedTensorRule scales{
        "{prefix}weight_scale_inv", {"{prefix}weight{expert}_scale_inv"}, {"blocks"}, true};
    scales.scale_of = "{prefix}weight";
    scales.blocks = core::fp8_scale_blocks();
    r.tensors = {
        {"{prefix}weight", {"{prefix}weight{expert}"}, {"out", "in"}},
        {"{prefix}bias", {"{prefix}bias{expert}"}, {"out"}, true, true},
        scales,
    };
    r.stacked_needs = "{prefix}_extra_state";
    r.grouped_linear_names = true;
    return r;
  }
  if (name == "hf") return fused_module_lists("hf", "gate_proj", "up_proj", "down_proj");
  if (name == "hf-w1w3") return fused_module_lists("hf-w1w3", "w1", "w3", "w2");
  if (name == "hf-fc") return fused_module_lists("hf-fc", "fc1", "fc3", "fc2");
  if (name == "hf-up-down") return fused_module_lists("hf-up-down", "", "up_proj", "down_proj");
  if (name == "hf-mixtral") {
    LayoutRules r = fused_module_lists("hf-mixtral", "w1", "w3", "w2");
    r.renames = {{".block_sparse_moe.", ".mlp."}};
    return r;
  }
  if (name == "stacked") return stacked_only("stacked", false);
  if (name == "stacked-transposed") return stacked_only("stacked-transposed", true);
  if (name == "stacked-transposed-up-down") {
    return stacked_only("stacked-transposed-up-down", true, false);
  }
  if (name == "gpt-oss") return gpt_oss();
  if (name == "stacked-linear") return stacked_linear();
  if (name == "folded") return folded();
  std::string known;
  std::vector<std::string> names;
  for (const char* n : kStructures) {
    known += (known.empty() ? "" : ", ") + std::string(n);
    names.emplace_back(n);
  }
  for (const ModelFamily& f : model_families()) names.push_back(f.model_type);
  throw Error(ErrorCode::InvalidArgument, "layout rules " + quote(name) + ": no such built-in set" +
                                              did_you_mean(name, names) + " (known: " + known +
                                              ", and the model types `grouplin rules` lists)");
}

const ModelFamily* family_of(std::string_view model_type) {
  for (const ModelFamily& f : model_families()) {
    if (f.model_type == model_type) return &f;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> builtin_rule_names() {
  std::vector<std::string> out(std::begin(kStructures), std::end(kStructures));
  for (const ModelFamily& f : model_families()) {
    if (!f.structure.empty()) out.push_back(f.model_type);
  }
  return out;
}

namespace {

// A built-in set, built and checked (every check parse_rules makes).
layout::CompiledRules build(std::string_view name) {
  const ModelFamily* f = family_of(name);
  if (f != nullptr && f->structure.empty()) {
    throw Error(ErrorCode::InvalidArgument, "layout rules " + quote(name) +
                                                ": GroupLin has no rules for this model type (" +
                                                f->not_applied + ")");
  }
  LayoutRules r = structure(f != nullptr ? std::string_view(f->structure) : name);
  if (f != nullptr) {
    r.name = f->model_type;
    r.renames.insert(r.renames.end(), f->renames.begin(), f->renames.end());
    r.renames_after = f->renames_after;
    r.joins = f->joins;
  }
  return layout::compile_rules(r, "built-in " + r.name);
}

}  // namespace

namespace layout {

const CompiledRules& compiled_builtin(std::string_view name) {
  // Every built-in set, compiled once per process (thread-safe: a function-local static).
  static const std::map<std::string, CompiledRules, std::less<>> sets = [] {
    std::map<std::string, CompiledRules, std::less<>> out;
    for (const std::string& n : builtin_rule_names()) out.emplace(n, build(n));
    return out;
  }();
  if (auto it = sets.find(name); it != sets.end()) return it->second;
  build(name);  // not a built-in set: throws the error that names the known ones
  throw Error(ErrorCode::InvalidArgument, "layout rules " + quote(name) + ": no such built-in set");
}

}  // namespace layout

LayoutRules builtin_rules(std::string_view name) { return layout::compiled_builtin(name).rules; }

std::optional<std::string> rules_for_model_type(std::string_view model_type) {
  const ModelFamily* f = family_of(model_type);
  if (f == nullptr || f->structure.empty()) return std::nullopt;
  return f->model_type;
}

}  // namespace grouplin
