#include "grouplin/layout.hpp"

namespace grouplin {

std::string_view layout_name(ExpertLayout layout) {
  return layout == ExpertLayout::Single ? "single" : "per-expert";
}

std::string_view layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::PerExpert:
      return "per-expert";
    case WeightLayout::Contiguous:
      return "contiguous";
    case WeightLayout::Single:
      return "single";
  }
  return "unknown";
}

std::optional<ExpertLayout> expert_layout_from_name(std::string_view name) {
  if (name == "per-expert") return ExpertLayout::PerExpert;
  if (name == "single") return ExpertLayout::Single;
  return std::nullopt;
}

std::optional<WeightLayout> weight_layout_from_name(std::string_view name) {
  for (WeightLayout l : {WeightLayout::PerExpert, WeightLayout::Contiguous, WeightLayout::Single}) {
    if (name == layout_name(l)) return l;
  }
  return std::nullopt;
}

ExpertLayout checkpoint_layout(WeightLayout layout) {
  return layout == WeightLayout::Single ? ExpertLayout::Single : ExpertLayout::PerExpert;
}

}  // namespace grouplin
