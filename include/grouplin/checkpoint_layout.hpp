// Grouped modules inside a checkpoint, found by layout rules (layout_rules.hpp): the vocabulary
// that convert (convert.hpp), verify (compare.hpp), inspect (inspect.hpp) and load_state_dict
// share. How a module is rewritten in another layout is theirs to plan (privately).
//
//   grouplin::StateDict sd;  // e.g. grouplin::load_checkpoint("model.safetensors").tensors
//   sd.insert("mlp.experts.weight", grouplin::Tensor::zeros({8, 16, 32}, grouplin::DType::BF16));
//   for (const grouplin::GroupedModule& m : grouplin::find_grouped_modules(sd))
//     std::cout << m.prefix << " " << grouplin::layout_name(m.layout) << "\n";  // single
//
// A grouped module is a prefix P (empty, or ending in '.') under which a rule set's tensors are
// found, each either stacked (single layout) or as per-expert entries: with the te rules,
//   per-expert  P.weight0 .. P.weight{N-1}, each [out, in], and optionally P.bias0 ..
//               P.bias{N-1}, each [out] (indices in decimal, no leading zeros, at most 9
//               digits, N >= 1: the same rule GroupedLinear's load applies);
//   single      P.weight [N, out, in] and optionally P.bias [N, out] (or [N, 1, out]);
// each tensor in its own layout (a single weight beside per-expert biases is one module, whose
// layout is "mixed"). With the hf rules, P.{E}.gate_proj.weight, P.{E}.up_proj.weight and
// P.{E}.down_proj.weight are the per-expert form of P.gate_up_proj and P.down_proj.
// A stacked first tensor of the wrong rank is no module (a rank-2 P.weight is a linear layer),
// nor one beside a stacked tensor of the wrong rank (a rank-3 P.weight whose P.bias has rank 1
// is a convolution), nor, with detected rules, a stacked te P.weight alone without P._extra_state
// or a declaration (declared_modules below) beside it (conv1d [C, 1, K] of hybrid models:
// GroupedScan::unconfirmed). Everything else is an ordinary entry and passes through, byte for
// byte.
// The scan checks every candidate; the problems, each naming the module:
//   missing indices, a tensor for some experts only, per-expert entries without the
//   module's first tensor, a required tensor missing .................... PartialExpertSet
//   one tensor both stacked and per-expert ............................ BothLayoutsPresent
//   a tensor of the wrong rank, experts of different shapes, dims that disagree between
//   the module's tensors (a bias not [out]), a stacked tensor with no experts or whose
//   experts do not split into its parts (or its interleaved groups) ......... ShapeMismatch
//   experts (or parts) of one tensor in different dtypes .................... DTypeMismatch
//   FP8 scales whose shape fits no block shape of their rule over their weight's
//   shape (ceil(out / rows) x ceil(in / cols) per part) ................ ScaleShapeMismatch
//   a key that two rules claim ................................................ RuleConflict
//
// The functions share no state; they may run on several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/layout_rules.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

// One stacked tensor of a grouped module, as found.
struct ExpertTensor {
  std::string name;  // its name in the single layout: "m.experts.gate_up_proj"
  ExpertLayout layout = ExpertLayout::PerExpert;
  Shape expert_shape;  // one expert's slice in the per-expert orientation: [2I, H]
  DType dtype = DType::F32;
  std::vector<std::string> keys;  // its entries in the dict, in dict order
  // How the stacked form stores each expert (StackedTensorRule): transposed ([N, in, out]), and
  // its rows in `interleave` interleaved groups (gpt-oss's gate and up).
  bool transposed = false;
  int64_t interleave = 1;
  bool folded = false;  // the experts folded into the stored tensor's first dim (DBRX)
  // FP8 scales: the name of the tensor they scale ("m.experts.gate_up_proj"), "" for others,
  // and the block shape found ([128, 128], [1, 32]; [] for one scale per expert).
  std::string scale_of;
  std::vector<int64_t> block;
};

// One grouped module found in a state dict.
struct GroupedModule {
  std::string prefix;  // "model.layers.3.mlp.experts." ("" at the root), as spelled in the dict
  ExpertLayout layout = ExpertLayout::PerExpert;  // of its first tensor
  bool mixed = false;                             // its tensors are not all in `layout`
  int64_t num_experts = 0;
  int64_t out_features = 0;  // dims of one expert of the first tensor, when it has two
  int64_t in_features = 0;
  DType dtype = DType::F32;       // of the first tensor (the weights)
  bool bias = false;              // it has a tensor P.bias (the te rules)
  DType bias_dtype = DType::F32;  // of the biases, when bias
  std::vector<std::string> keys;  // the module's entries in the dict, in dict order
  std::string rules;              // name of the rule set that found it: "te", "hf", ...
  // Its rule set names GroupedLinear's own entries (LayoutRules::grouped_linear_names).
  bool grouped_linear_names = false;
  // Its rule set has no per-expert names of its own (PerExpertForm::TeOnly: stacked on the Hub).
  bool stacked_only = false;
  std::vector<ExpertTensor> tensors;  // in the rule set's order
};

// A stacked tensor that detected rules did not take for a module for want of evidence
// (LayoutRules::stacked_needs: te's P.weight alone, without P._extra_state or a declaration):
// experts, or a convolution; the rules asked for by name take it.
struct UnconfirmedStack {
  std::string prefix;  // "model.layers.0.mlp.experts."
  std::string name;    // the stacked tensor: "model.layers.0.mlp.experts.weight"
  std::string needs;   // the entry that would confirm it: "model.layers.0.mlp.experts._extra_state"
  std::string rules;   // the set that would take it: "te"

  // Why it was not taken and how to take it, for messages: "named as the stacked weight of rules
  // \"te\", but without ... beside it, it may be a convolution; ... (--rules te)".
  std::string reason() const;
};

// What a scan found: the consistent grouped modules, in the order of their first entry in the
// dict, and one Error per inconsistent candidate (codes listed above).
struct GroupedScan {
  std::vector<GroupedModule> modules;
  std::vector<Error> problems;
  std::vector<UnconfirmedStack> unconfirmed;  // in dict order
  // The entries of the inconsistent candidates `problems` are about, in dict order: what the
  // problems already cover (a scale there needs no report of its own).
  std::vector<std::string> problem_keys;
};

// The rule sets that fit `dict`. When `model_type` (config.json) names a family GroupLin knows,
// that family's set alone. Otherwise te (whose stacked weights then need P._extra_state beside
// them) and at most one Hugging Face structure: the one whose per-expert names the keys use (a
// set with renames, such as hf-mixtral, when a key holds what it renames); for keys of a stacked
// form only, gpt-oss when a key ends in "gate_up_proj_bias", else the first of hf and
// stacked-transposed that finds modules without problems (or, when neither does, hf). The first set
// wins a key both would claim (RuleConflict is for explicit sets).
std::vector<LayoutRules> detect_rules(const StateDict& dict, std::string_view model_type = "");

// Finds the grouped modules of `dict` with `rules` (detect_rules(dict) when empty). Never throws
// for what the dict holds; problems are returned. Reads no tensor data.
GroupedScan scan_grouped_modules(const StateDict& dict, const std::vector<LayoutRules>& rules = {});

// scan_grouped_modules, throwing the first problem (in dict order) if there is any.
std::vector<GroupedModule> find_grouped_modules(const StateDict& dict,
                                                const std::vector<LayoutRules>& rules = {});

// The safetensors metadata entry in which GroupLin declares grouped modules that detection could
// not tell from other tensors of their shape: a JSON array of prefixes. Nothing else of the file
// changes, so a converted file keeps every tensor byte for byte.
inline constexpr const char* kDeclaredModulesKey = "grouplin.grouped_modules";
// The safetensors metadata entry in which GroupLin records the model type (config.json's
// model_type) whose family's rules converted a file, so that the file is read by them again
// without its config.json beside it (a fused Mixtral converted back comes out under Mixtral's
// names, not Qwen's). A directory's config.json comes first.
inline constexpr const char* kModelTypeKey = "grouplin.model_type";
// The prefixes `metadata` declares ([] when it has no kDeclaredModulesKey). Throws
// Error(InvalidMetadata) naming `source` when the entry is not a JSON array of strings.
std::vector<std::string> declared_modules(const std::map<std::string, std::string>& metadata,
                                          const std::string& source);
// `metadata` with kDeclaredModulesKey set to `prefixes` (removed when they are empty).
std::map<std::string, std::string> with_declared_modules(
    std::map<std::string, std::string> metadata, const std::vector<std::string>& prefixes);

}  // namespace grouplin
