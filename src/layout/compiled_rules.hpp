// Private: a rule set checked and its key patterns compiled, once: what parse_rules and
// builtin_rules check, and what the scan and the planner match with.
//
//   layout::CompiledRules c = layout::compile_rules(builtin_rules("hf"), "built-in hf");
//   c.parts[0][1].match("m.experts.3.up_proj.weight");  // prefix "m.experts.", expert 3
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/layout_rules.hpp"
#include "grouplin/tensor.hpp"
#include "layout/key_pattern.hpp"

namespace grouplin::layout {

struct CompiledRules {
  LayoutRules rules;
  std::vector<KeyPattern> stacked;             // per tensor
  std::vector<std::vector<KeyPattern>> parts;  // per tensor, per part
  std::optional<KeyPattern> stacked_needs;     // when rules.stacked_needs is set
  std::optional<KeyPattern> experts_from;      // when rules.experts_from is set
  std::vector<int> scale_of;                   // per tensor: the tensor it scales, or -1
};

// Checks `rules` and compiles its patterns. Throws Error(InvalidRules) naming `source`, the field
// and what is wrong: no tensors, an optional first tensor, a pattern without exactly one
// "{prefix}" at its start (and, for parts, one "{expert}"), empty parts or dims, a rename with an
// empty side, transposed without two dims, a transpose or an interleave beside several parts, an
// interleave below 1.
CompiledRules compile_rules(const LayoutRules& rules, const std::string& source);

// The built-in set `name` (builtin_rules), compiled once per process and kept. Throws as
// builtin_rules.
const CompiledRules& compiled_builtin(std::string_view name);

}  // namespace grouplin::layout
