// Private: what a GroupedLinear tells the load planner it holds (layout/load_target.hpp).
#pragma once

#include <string>

#include "grouplin/grouped_linear.hpp"
#include "layout/load_target.hpp"

namespace grouplin {

// `g`'s entries under `prefix` ("" or ending in '.'): its expert count, shapes, layouts and
// whether its weights are FP8 codes with scales.
layout::LoadTarget load_target(const GroupedLinear& g, const std::string& prefix);

}  // namespace grouplin
