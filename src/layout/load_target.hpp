// Private: the last step of the Load plan. A GroupedLinear tells the planner what it holds (a
// LoadTarget); fit_load_targets rewrites the planned tensors so that each target's entries appear
// under exactly the names the module holds, checked against its expert count and shapes, and FP8
// codes with their scales as the two entries they are. The module's own part of the load is then
// a name match (src/nn/grouped_linear_load.cpp).
//
//   std::vector<PlannedTensor> tensors = layout::plan(dict, Target::Load, options).tensors;
//   layout::LoadFindings f = layout::fit_load_targets(tensors, targets, /*strict=*/true);
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/load_state_dict.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::layout {

// One GroupedLinear as a load fills it: its entries are P.weight [N, out, in] (Single) or
// P.weight0 .. P.weight{N-1} [out, in] (PerExpert, Contiguous), the same for the biases [out] in
// their own layout, and for FP8 weights the scales P.weight_scale_inv or P.weight{i}_scale_inv.
struct LoadTarget {
  std::string prefix;  // "decoder.layers.3.mlp.fc1." ("" at the root), as the source names it
  int64_t num_experts = 0;
  int64_t out_features = 0;
  int64_t in_features = 0;
  WeightLayout weight_layout = WeightLayout::PerExpert;
  bool bias = false;
  WeightLayout bias_layout = WeightLayout::PerExpert;
  bool fp8 = false;  // F8_E4M3 codes with one F32 scale per core::kFp8Block square block
};

// What fitting found, for the load's report: each problem once, with its named code.
struct LoadFindings {
  std::vector<Problem> problems;
  std::vector<LayoutConversion> conversions;
  // Module keys a problem already accounts for: not reported missing as well.
  std::vector<std::string> covered;
  // Module key -> the source key its bytes come from, where they differ (an expert of a stacked
  // entry): reports name what the source holds.
  std::unordered_map<std::string, std::string> origins;
};

// Rewrites `tensors` (the Load plan's, FP8 tensors of FP8 targets not dequantized) for `targets`:
// a stacked source entry of a per-expert target becomes one view per expert (P.weight{i}); the
// per-expert entries of a Single target stay per-expert (the module copies each into its slice);
// FP8 codes and their scales (PlannedTensor::scale_of, else core::fp8_scale_name) are renamed as
// the module names them. Entries that cannot load are removed and their problem recorded:
// BothLayoutsPresent, ExpertCountMismatch, ShapeMismatch (a stacked entry split into experts),
// PartialExpertSet (`strict`; else the module reports the absent experts missing),
// Fp8ScalesNotApplied and UnsupportedConversion (FP8 targets). Other tensors are left as they
// are.
LoadFindings fit_load_targets(std::vector<PlannedTensor>& tensors,
                              const std::vector<LoadTarget>& targets, bool strict);

}  // namespace grouplin::layout
