// Private: the renames of layout rules applied to a key, both ways.
//
//   layout::renamed("m.block_sparse_moe.gate.weight", mixtral, true);  // "m.mlp.gate.weight"
#pragma once

#include <string>
#include <string_view>

#include "grouplin/layout_rules.hpp"

namespace grouplin::layout {

// `key` with every rename of `rules` applied toward the single layout (in order), or undone
// toward the per-expert one (in reverse order). Each rename replaces every occurrence of its one
// side by the other, except an occurrence that is already part of the other side: a rename whose
// result holds its source ("post_mlp_layernorm" -> "mlp.post_mlp_layernorm") then changes a key
// once however often it is applied, and a key already in the target spelling stays as it is.
// A rename whose source starts with '^' ("^head.weight") applies at the start of a key only,
// both ways. Others, with rules.renames_after ("model."), apply after that leading text of a key
// (unless the side they look for starts with it: "backbone." -> "model." undone).
std::string renamed(std::string_view key, const LayoutRules& rules, bool to_single);

}  // namespace grouplin::layout
