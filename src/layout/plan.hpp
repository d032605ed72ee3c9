// Private: the plan that rewrites a checkpoint's grouped modules in another layout without
// copying anything (plan_conversion, for convert), and its engine with the two targets that only
// GroupLin's own callers use, where each module's layout depends on its family.
//
//   ConversionPlan plan = plan_conversion(sd, ExpertLayout::PerExpert);
//   for (const PlannedTensor& t : plan.tensors)  // each piece is a view of sd
//     std::cout << t.name << ": " << t.pieces.size() << " pieces, " << t.nbytes() << " bytes\n";
//   ConversionPlan p = layout::plan(dict, layout::Target::Compare, options);  // for verify
//
// plan_conversion throws what the scan finds (checkpoint_layout.hpp); with rules given explicitly
// it also refuses a rule set that matches nothing (RuleMatchedNothing), and a change of layout
// that would fuse or split block scales where a part of the weight does not end on a block
// boundary (ScaleBlocksUnaligned: the scales of gate_proj and up_proj cannot be concatenated
// when I is not a multiple of the block rows).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "layout/compiled_rules.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin {

// The entries of `dict` with every grouped module in `target` layout.
struct ConversionPlan {
  std::vector<GroupedModule> modules;  // as found in the source (their source layout)
  std::vector<PlannedTensor> tensors;  // in output order
  // Prefixes of the output's modules that detected rules would not find again without a
  // declaration (a stacked first tensor alone, without its set's stacked_needs entry): what
  // convert writes in safetensors metadata (kDeclaredModulesKey), in output order.
  std::vector<std::string> to_declare;
  // What the scan could not confirm (GroupedScan::unconfirmed): passed through as it is.
  std::vector<UnconfirmedStack> unconfirmed;
};

struct PlanOptions {
  // The rule sets; empty: detect_rules(dict, model_type). When given, each must match at least
  // one module (RuleMatchedNothing). A set of GroupedLinear's names (te;
  // LayoutRules::grouped_linear_names) beside a stacked-only family's set (or alone, when
  // model_type names such a family) asks for TransformerEngine per-expert names for that family's
  // modules instead of Error(NoPerExpertForm).
  std::vector<LayoutRules> rules{};
  std::string model_type{};  // config.json's model_type, for detect_rules
  // Keep only these experts of every module, renumbered from 0; unset: all. Error(OutOfBounds)
  // when a module has fewer than `end` experts or the range is empty.
  std::optional<ExpertRange> experts{};
  // Prefixes of modules the checkpoint declares (declared_modules() of its safetensors
  // metadata): a stacked tensor there is a module without its set's stacked_needs entry.
  std::vector<std::string> declared_modules{};
  // The caller dequantizes every FP8 weight with its scales (dequantize_plan): scales whose parts
  // do not end on a block boundary are concatenated part by part (PlannedTensor::part_rows) for
  // it instead of refused as ScaleBlocksUnaligned.
  bool dequantize = false;
};

// Plans the conversion of every grouped module of `dict` to `target`: per-expert -> single gives
// each stacked tensor whose pieces are the experts' entries (part by part: gate_0, up_0, gate_1,
// ...); single -> per-expert gives each expert's entries as views of the stacked tensor (split in
// equal parts along dim 0 for a tensor of several parts); entries of other keys pass through,
// renamed as the rule sets' renames say for `target`. Modules already in `target` layout (and
// not sliced) pass through in the dict's order; the others are written in the rule set's order
// (tensor-major for te, as GroupedLinear::state_dict() orders them; expert-major for hf, as
// module lists do), in the place of the module's first entry. A stacked-only family's modules
// (GroupedModule::stacked_only) go per-expert only under TransformerEngine names when te is asked
// for (PlanOptions::rules): transposed and de-interleaved, as rearranged pieces.
// Copies no tensor bytes; the pieces keep the source storages alive.
// Throws the first problem of scan_grouped_modules, the errors of PlanOptions above,
// Error(NoPerExpertForm) for a stacked-only family's module with target PerExpert without te, and
// Error(NoGroupedModules) when detected rules found no module but unconfirmed stacks (the
// conversion would change nothing). ConversionPlan::to_declare lists what a safetensors output
// must declare (with_declared_modules) to be found again without rules.
ConversionPlan plan_conversion(const StateDict& dict, ExpertLayout target,
                               const PlanOptions& options = {});

}  // namespace grouplin

namespace grouplin::layout {

enum class Target {
  Single,     // every module stacked, as transformers v5 holds it (plan_conversion)
  PerExpert,  // every module per-expert (plan_conversion; stacked-only families need te)
  // One form for comparing two checkpoints: per-expert where the family has per-expert names,
  // stacked (transformers v5's names) where it has none.
  Compare,
  // What GroupedLinear loads: stacked in the per-expert orientation ([N, out, in], unit dims
  // dropped) where that is the stored form, TransformerEngine per-expert names (transposed and
  // de-interleaved) for the stacked-only families that store another; modules in GroupedLinear's
  // own names as they are. A broken candidate of such a set is not an error here: its entries
  // pass as they are, for fit_load_targets (load_target.hpp) to check against the module's
  // expert count.
  Load,
};

// The rule sets a call works with, decided once: PlanOptions::rules as given (explicit), or the
// built-in sets detect_rules picks for the dict and model type.
struct ResolvedRules {
  std::vector<CompiledRules> sets;
  bool explicit_rules = false;
  // A set of GroupedLinear's names was asked for: stacked-only families may go per-expert.
  bool te_names = false;
};
ResolvedRules resolve(const StateDict& dict, const PlanOptions& options);

// plan_conversion for `target` (same contract, same errors).
ConversionPlan plan(const StateDict& dict, Target target, const PlanOptions& options);
// The same with the rules resolved already (for another dict: load_state_dict resolves them for
// the whole dict and plans the entries under its prefix).
ConversionPlan plan(const StateDict& dict, Target target, const PlanOptions& options,
                    const ResolvedRules& rules);

// scan_grouped_modules with the rules PlanOptions names: given ones are explicit, detection
// (empty rules) uses options.model_type. Never throws for what the dict holds.
GroupedScan scan(const StateDict& dict, const PlanOptions& options);

}  // namespace grouplin::layout
