// Private: the scan behind scan_grouped_modules and plan_conversion, with what planning needs
// beyond the public GroupedModule: which entry holds each part of each expert.
//
//   layout::ModuleScan scan = layout::scan_modules(dict, rules);
//   for (const layout::FoundModule& m : scan.found) ... m.tensors[t].parts[p].at(expert) ...
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/layout_rules.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin::layout {

// One stacked tensor of a module as the dict holds it.
struct FoundTensor {
  bool present = false;
  const StateDict::Entry* stacked = nullptr;  // single layout
  bool unit_dim = false;                      // stacked as [N, 1, ...]
  // Per-expert layout: for each part, expert index -> entry.
  std::vector<std::map<int64_t, const StateDict::Entry*>> parts;
  Shape part_shape;                // one part of one expert (equal for all parts but the first dim)
  std::vector<int64_t> part_rows;  // each part's first dim
};

struct FoundModule {
  size_t rules = 0;                  // index of its rule set
  std::string canonical;             // its prefix in the single layout (after renames)
  std::string spelled;               // its per-expert prefix (renames reversed)
  std::vector<FoundTensor> tensors;  // in the rule set's order
  size_t first_entry = 0;            // dict position of its first entry
};

struct ModuleScan {
  GroupedScan scan;                // modules[i] describes found[i]
  std::vector<FoundModule> found;  // the consistent modules, in dict order
  std::vector<bool> matched;       // per rule set: some module (or problem) used it
};

// Applies every rename of `rules` to `key`: toward the single layout, or back.
std::string renamed(std::string_view key, const LayoutRules& rules, bool to_single);

// Scans `dict` with `rules`. With `explicit_rules`, a key two sets claim is a RuleConflict;
// otherwise the first set wins it (detected sets overlap only by accident).
ModuleScan scan_modules(const StateDict& dict, const std::vector<LayoutRules>& rules,
                        bool explicit_rules);

}  // namespace grouplin::layout
