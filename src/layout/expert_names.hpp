// Private: the one rule for the names of a grouped module's entries, used by the checkpoint scan
// (src/layout/checkpoint_layout.cpp), by the load planner (src/layout/load_target.cpp) and by
// GroupedLinear's names (src/nn/grouped_linear_load.cpp), so that a name is an expert entry for
// all or for none.
//
//   layout::expert_index("weight12", "weight")   // 12
//   layout::expert_index("weight012", "weight")  // nullopt: not canonical
//   layout::expert_key("model.experts.", "bias", 3)  // "model.experts.bias3"
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace grouplin::layout {

// Expert indices have at most 9 decimal digits: far from overflow, and no model has a billion
// experts in one module. "weight1234567890" is an ordinary entry, not expert 1234567890.
inline constexpr size_t kMaxIndexDigits = 9;

// The index i of a leaf `base`{i} ("weight12" for base "weight" -> 12): decimal, no sign, no
// leading zero (except "0" itself), at most kMaxIndexDigits digits. nullopt for anything else
// ("weight", "weight_scale", "weight012", "weight1234567890").
std::optional<int64_t> expert_index(std::string_view leaf, std::string_view base);

// prefix + base + decimal index: the key of expert `index`'s entry.
std::string expert_key(std::string_view prefix, std::string_view base, int64_t index);

// A state-dict key split at its last '.': "a.b.weight3" -> prefix "a.b.", leaf "weight3".
struct SplitKey {
  std::string_view prefix;  // "" or ending in '.'
  std::string_view leaf;
};
SplitKey split_key(std::string_view key);

}  // namespace grouplin::layout
