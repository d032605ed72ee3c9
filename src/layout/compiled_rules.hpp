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

// The block shapes of FP8 scales GroupLin knows, in the order they are tried: [128, 128]
// (DeepSeek-V3, Qwen3-FP8), [1, 32] (MXFP8), [] (one scale per matrix: Float8Tensor).
const std::vector<std::vector<int64_t>>& fp8_scale_blocks();
// The scales of a [rows, cols] matrix in `block`: [ceil(rows / r), ceil(cols / c)] for [r, c], [1]
// for {} (one per matrix).
Shape block_scale_shape(int64_t rows, int64_t cols, const std::vector<int64_t>& block);
// "[2, 1] ([128, 128] blocks)", or "[1] (one per <whole>)" for {}: what a message expects.
std::string expected_scales(const Shape& shape, const std::vector<int64_t>& block,
                            std::string_view whole);

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
