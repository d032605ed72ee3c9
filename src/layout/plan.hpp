// Private: plan_conversion's engine with the two targets that only GroupLin's own callers use,
// where each module's layout depends on its family.
//
//   ConversionPlan p = layout::plan(dict, layout::Target::Compare, options);  // for verify
#pragma once

#include "grouplin/checkpoint_layout.hpp"
#include "layout/compiled_rules.hpp"

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
