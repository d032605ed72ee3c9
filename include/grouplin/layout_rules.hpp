// Layout rules: how the experts of a grouped module are named in a checkpoint, declared as data.
//
//   grouplin::LayoutRules hf = grouplin::builtin_rules("hf");  // Qwen, OLMoE, DeepSeek names
//   grouplin::LayoutRules mine = grouplin::parse_rules(R"({"name": "mine", "tensors": [
//       {"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"], "dims": ["out", "in"]}]})",
//       "inline rules");
//   std::cout << hf.name << ": " << hf.tensors.size() << " stacked tensors\n";
//
// A rule set names, for one module family, each stacked tensor and the per-expert tensors it is
// made of, and the renames that go with stacking. The engine (checkpoint_layout.hpp) does the
// rest both ways: stack a module list (MergeModulelist in transformers v5), concatenate
// several projections along a dim (Concatenate), and the inverses (unbind, split in equal parts).
// docs/rules.md describes the JSON form; the built-in sets are:
//
//   te          TransformerEngine / Megatron: P.weight{i} [out, in] <-> P.weight [N, out, in];
//               P.bias{i} [out] <-> P.bias [N, out] (read also as [N, 1, out]); weight and bias
//               each in its own layout (a single weight beside per-expert biases is valid)
//   hf          Hugging Face module lists of Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, GLM4-MoE, Jamba:
//               P.{E}.gate_proj.weight + P.{E}.up_proj.weight <-> P.gate_up_proj [N, 2I, H],
//               P.{E}.down_proj.weight <-> P.down_proj [N, H, I] (transformers v5's fused form),
//               and FP8 scales alike (P.{E}.gate_proj.weight_scale_inv <->
//               P.gate_up_proj_scale_inv)
//   hf-w1w3     the same with w1 (gate), w3 (up), w2 (down): PhiMoE, LFM2-MoE
//   hf-mixtral  w1/w3/w2 under "block_sparse_moe.", which the fused form renames to "mlp." in
//               every key, the router's included: Mixtral, MiniMax
//
// Patterns: "{prefix}" is a key prefix (empty, or ending in '.'), "{expert}" an expert index
// (decimal, no leading zero, at most 9 digits: the rule of every expert name in GroupLin).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace grouplin {

// One stacked tensor of a module and the per-expert tensors it is made of.
struct StackedTensorRule {
  // Its name in the single layout: "{prefix}gate_up_proj".
  std::string stacked;
  // The per-expert tensors whose bytes make one expert's slice, concatenated along their first
  // dim in this order: {"{prefix}{expert}.gate_proj.weight", "{prefix}{expert}.up_proj.weight"}.
  std::vector<std::string> parts;
  // Names of each part's dims, checked to agree across the module's tensors ("out", "in"); the
  // parts' rank is dims.size(). The stacked tensor is [N, sum of the parts' first dims, ...].
  std::vector<std::string> dims;
  // A module may lack this tensor (a bias, FP8 scales). The first rule of a set is never optional:
  // it is what makes a prefix a module.
  bool optional = false;
  // The stacked tensor may also be saved with a unit dim after the experts ([N, 1, out]).
  bool unit_dim = false;
};

struct LayoutRules {
  std::string name;
  // Substring renames from the per-expert spelling to the single one, applied to every key of a
  // checkpoint written in the single layout, and reversed for the per-expert layout.
  std::vector<std::pair<std::string, std::string>> renames;
  std::vector<StackedTensorRule> tensors;
  // Per-expert entries ordered expert by expert (0.gate, 0.up, 0.down, 1.gate, ...), as module
  // lists save them; otherwise tensor by tensor (weight0..weight{N-1}, bias0..), as TE does.
  bool expert_major = false;
};

// The names builtin_rules knows: "te", "hf", "hf-w1w3", "hf-mixtral".
std::vector<std::string> builtin_rule_names();
// A built-in set (above). Throws Error(InvalidArgument) naming the known sets for another name.
LayoutRules builtin_rules(std::string_view name);
// The built-in set for a transformers `model_type` (config.json): "mixtral" -> hf-mixtral,
// "qwen3_moe" -> hf, ...; nullopt when the type has no fused experts GroupLin knows.
std::optional<std::string> rules_for_model_type(std::string_view model_type);

// Parses a rule set from its JSON form (docs/rules.md). `source` names it in messages. Throws
// Error(InvalidRules) naming the source, the field and what is wrong: not JSON, unknown or
// missing fields, a pattern without exactly one "{prefix}" at its start (and, for parts, one
// "{expert}"), no tensors, an optional first tensor, dims that differ in count between parts.
LayoutRules parse_rules(std::string_view json, const std::string& source);
// parse_rules of the file at `path`; also Error(IoError) if it cannot be read.
LayoutRules load_rules(const std::string& path);

}  // namespace grouplin
