// Private: which planned tensors are FP8 weights with their scales beside them, and the plan
// that reads them as values instead (ConvertOptions::dtype, load_state_dict into a float module).
//
//   ConversionPlan p = layout::plan(dict, layout::Target::Single, options);
//   size_t n = layout::dequantize_plan(p.tensors, DType::BF16, layout::MissingScales::Refuse);
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::layout {

// Which planned tensor holds each FP8 weight's scales, the one rule for dequantization and for
// loading into FP8 modules: the tensor whose PlannedTensor::scale_of names the weight (a grouped
// module's, as its rules declare), else, for a dense weight, the entry named
// core::fp8_scale_name(weight) that scales nothing else. Also finds tensors by name.
class ScaleIndex {
 public:
  explicit ScaleIndex(const std::vector<PlannedTensor>& tensors);
  // The index of the tensor named `name`.
  std::optional<size_t> find(const std::string& name) const;
  // The index of the scales of the weight named `weight`.
  std::optional<size_t> scales_of(const std::string& weight) const;

 private:
  const std::vector<PlannedTensor>& tensors_;
  std::unordered_map<std::string, size_t> index_, scales_of_;
};

// What an FP8 tensor without scales beside it becomes.
enum class MissingScales {
  Refuse,  // Error(Fp8ScalesNotApplied): its codes are not its values
  Keep,    // left as it is, for the caller to refuse or take as codes
};

// The dequantization of `codes` (a stack of matrices, its last two dims; a tensor of rank below 2
// is one row) by `scales`: the first block of core::fp8_scale_blocks() whose scale shape fits.
// Throws Error(ScaleShapeMismatch) naming both when none does.
Dequantization fit_blocks(const PlannedTensor& codes, const PlannedTensor& scales);

// Replaces each F8_E4M3 or F8_E5M2 tensor T that has a tensor named T + "_scale_inv" beside it by
// T read as values of dtype `to` (F32, BF16 or F16), and drops those scales; returns how many.
// The block of the scales is the first of fp8_scale_blocks() whose shape fits T's matrices (its
// last two dims; a tensor of rank below 2 is one row): Error(ScaleShapeMismatch) naming both if
// none does. Error(UnsupportedConversion) for a rearranged (transposed, interleaved) T or scales.
// Every other tensor is left as it is, in order.
size_t dequantize_plan(std::vector<PlannedTensor>& tensors, DType to, MissingScales missing);

// The FP8 weights outside `scan`'s grouped modules (dense layers) whose scales beside them fit no
// block, one Error(ScaleShapeMismatch) each, as dequantize_plan would throw it, and the scales
// without their weight (scales_without_weight), one Error(ScaleWithoutWeight) each; scales the
// scan already reports a problem for are left to it. Never throws for what the dict holds.
std::vector<Error> scale_problems(const StateDict& dict, const GroupedScan& scan);

// The entries of `dict` outside `modules` named as the scales of a weight (core::fp8_weight_of)
// that the dict does not hold, in dict order: nothing dequantizes them, they pass as they are.
std::vector<std::string> scales_without_weight(const StateDict& dict,
                                               const std::vector<GroupedModule>& modules);

}  // namespace grouplin::layout
