// Private: the scan behind scan_grouped_modules and plan_conversion, with what planning needs
// beyond the public GroupedModule: which entry holds each part of each expert.
//
//   std::vector<layout::CompiledRules> sets = ...;  // layout::compile_rules of each set
//   layout::ModuleScan scan = layout::scan_modules(dict, sets, /*explicit_rules=*/false);
//   for (const layout::FoundModule& m : scan.found) ... m.tensors[t].parts[p].at(expert) ...
//
// Each key is claimed by the patterns of every set (per-expert names of a set with native ones
// as spelled, stacked names and TransformerEngine-only per-expert names after the set's renames);
// the claims under one prefix make a candidate, which module_check.cpp checks.
#pragma once

#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "layout/compiled_rules.hpp"
#include "layout/module_check.hpp"

namespace grouplin::layout {

struct ModuleScan {
  GroupedScan scan;                // modules[i] describes found[i]
  std::vector<FoundModule> found;  // the consistent modules, in dict order
  std::vector<bool> matched;       // per rule set: some module (or problem) used it
  // Per scan.problems[i]: the index of the set whose candidate it is (sets.size() for a
  // RuleConflict, which is no one set's).
  std::vector<size_t> problem_sets;
};

// Scans `dict` with `sets`. With `explicit_rules`, a key two sets claim is a RuleConflict, and a
// set's stacked_needs is not required; otherwise the first set wins a key (detected sets overlap
// only by accident), and a prefix in `declared` needs no stacked_needs entry either.
ModuleScan scan_modules(const StateDict& dict, const std::vector<CompiledRules>& sets,
                        bool explicit_rules, const std::vector<std::string>& declared = {});

}  // namespace grouplin::layout
