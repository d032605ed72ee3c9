// FP8 weights paired with their scales and planned as values (layout/dequantize_plan.hpp).
#include "layout/dequantize_plan.hpp"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "layout/compiled_rules.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::layout {
namespace {}  // namespace

Dequantization fit_blocks(const PlannedTensor& codes, const PlannedTensor& scales) {
  Dequantization d;
  d.codes = codes.dtype;
  d.scale_dtype = scales.dtype;
  d.scales = scales.pieces;
  d.scales_name = scales.name;
  Shape lead;
  if (scales.part_rows > 0 && codes.rank() >= 2) {
    // Scales of parts concatenated (module_plan.cpp): each part of each matrix is a matrix of
    // its own, scaled by its own blocks; the scales hold them in the same order.
    d.rows = scales.part_rows;
    d.cols = codes.shape[codes.rank() - 1];
    const int64_t matrix_rows = codes.shape[codes.rank() - 2];
    if (matrix_rows % d.rows == 0) {
      lead = {shape_numel(codes.shape) / (d.rows * d.cols)};
      for (const std::vector<int64_t>& b : core::fp8_scale_blocks()) {
        if (b.empty()) continue;
        const Shape per_part = core::block_scale_shape(d.rows, d.cols, b);
        if (shape_numel(scales.shape) == lead[0] * shape_numel(per_part) &&
            scales.shape.back() == per_part.back()) {
          d.block_rows = b[0];
          d.block_cols = b[1];
          return d;
        }
      }
    }
    throw Error(ErrorCode::ScaleShapeMismatch,
                "dequantizing " + quote(codes.name) + " " + shape_to_string(codes.shape) + ": " +
                    quote(scales.name) + " " + shape_to_string(scales.shape) +
                    " holds the block scales of parts of " + std::to_string(d.rows) +
                    " rows each, which fit no block of its matrices");
  }
  if (codes.rank() >= 2) {
    lead.assign(codes.shape.begin(), codes.shape.end() - 2);
    d.rows = codes.shape[codes.rank() - 2];
    d.cols = codes.shape[codes.rank() - 1];
  } else {
    d.rows = 1;
    d.cols = shape_numel(codes.shape);
  }
  const int64_t matrices = shape_numel(lead);
  std::string expected;
  for (const std::vector<int64_t>& b : core::fp8_scale_blocks()) {
    Shape want = lead;
    const Shape per_matrix = core::block_scale_shape(d.rows, d.cols, b);
    want.insert(want.end(), per_matrix.begin(), per_matrix.end());
    // One per matrix fits any shape of that many values ([N], [N, 1], [N, 1, 1]).
    const bool fits = b.empty() ? shape_numel(scales.shape) == matrices : scales.shape == want;
    if (fits) {
      d.block_rows = b.empty() ? d.rows : b[0];
      d.block_cols = b.empty() ? d.cols : b[1];
      return d;
    }
    expected += (expected.empty() ? "" : " or ") + core::expected_scales(want, b, "matrix");
  }
  throw Error(ErrorCode::ScaleShapeMismatch,
              "dequantizing " + quote(codes.name) + " " + shape_to_string(codes.shape) + ": " +
                  quote(scales.name) + " has shape " + shape_to_string(scales.shape) +
                  "; its scales would be " + expected);
}

ScaleIndex::ScaleIndex(const std::vector<PlannedTensor>& tensors) : tensors_(tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    index_.emplace(tensors[i].name, i);
    if (!tensors[i].scale_of.empty()) scales_of_.emplace(tensors[i].scale_of, i);
  }
}

std::optional<size_t> ScaleIndex::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? std::nullopt : std::optional<size_t>(it->second);
}

std::optional<size_t> ScaleIndex::scales_of(const std::string& weight) const {
  if (auto it = scales_of_.find(weight); it != scales_of_.end()) return it->second;
  const std::optional<size_t> named = find(core::fp8_scale_name(weight));
  if (named && tensors_[*named].scale_of.empty()) return named;
  return std::nullopt;
}

size_t dequantize_plan(std::vector<PlannedTensor>& tensors, DType to, MissingScales missing) {
  if (to != DType::F32 && to != DType::BF16 && to != DType::F16) {
    throw Error(ErrorCode::InvalidArgument,
                "dequantizing to " + std::string(dtype_name(to)) + ": expected F32, BF16 or F16");
  }
  const ScaleIndex scales_index(tensors);
  std::vector<bool> dropped(tensors.size(), false);
  size_t count = 0;
  for (PlannedTensor& t : tensors) {
    if (!core::is_fp8(t.dtype) || t.dequantize) continue;
    const std::optional<size_t> at = scales_index.scales_of(t.name);
    if (!at) {
      if (missing == MissingScales::Keep) continue;
      throw Error(ErrorCode::Fp8ScalesNotApplied,
                  quote(t.name) + " is " + std::string(dtype_name(t.dtype)) + " without " +
                      quote(core::fp8_scale_name(t.name)) +
                      " beside it: its codes are not its values, and there are no scales to "
                      "dequantize it with");
    }
    const PlannedTensor& scales = tensors[*at];
    if (t.rearrange || scales.rearrange) {
      throw Error(ErrorCode::UnsupportedConversion,
                  "dequantizing " + quote(t.name) +
                      ": it is stored transposed or interleaved, which GroupLin does not "
                      "dequantize");
    }
    t.dequantize = fit_blocks(t, scales);
    t.dtype = to;
    dropped[*at] = true;
    ++count;
  }
  std::vector<PlannedTensor> kept;
  kept.reserve(tensors.size() - count);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (dropped[i]) continue;
    if (tensors[i].part_rows > 0) {  // planned for dequantization, yet its weight was not FP8
      throw Error(ErrorCode::ScaleBlocksUnaligned,
                  quote(tensors[i].name) + " holds the block scales of parts of " +
                      std::to_string(tensors[i].part_rows) + " rows of " +
                      quote(tensors[i].scale_of) +
                      ", which is not dequantized; they cannot be concatenated exactly");
    }
    kept.push_back(std::move(tensors[i]));
  }
  tensors = std::move(kept);
  return count;
}

std::vector<std::string> scales_without_weight(const StateDict& dict,
                                               const std::vector<GroupedModule>& modules) {
  std::unordered_set<std::string> in_modules;
  for (const GroupedModule& m : modules) in_modules.insert(m.keys.begin(), m.keys.end());
  std::vector<std::string> out;
  for (const auto& [name, t] : dict) {
    const std::optional<std::string> weight = core::fp8_weight_of(name);
    if (weight && !dict.contains(*weight) && in_modules.count(name) == 0) out.push_back(name);
  }
  return out;
}

std::vector<Error> scale_problems(const StateDict& dict, const GroupedScan& scan) {
  std::unordered_set<std::string> in_modules;
  for (const GroupedModule& m : scan.modules) in_modules.insert(m.keys.begin(), m.keys.end());
  const std::unordered_set<std::string> reported(scan.problem_keys.begin(),
                                                 scan.problem_keys.end());
  std::vector<Error> out;
  for (const auto& [name, t] : dict) {
    if (!core::is_fp8(t.dtype()) || in_modules.count(name) != 0) continue;
    const std::string scale_name = core::fp8_scale_name(name);
    const Tensor* scales = dict.find(scale_name);
    if (scales == nullptr || in_modules.count(scale_name) != 0 || reported.count(scale_name)) {
      continue;
    }
    try {
      fit_blocks(PlannedTensor::of(name, t), PlannedTensor::of(scale_name, *scales));
    } catch (const Error& e) {
      out.push_back(e);
    }
  }
  for (const std::string& name : scales_without_weight(dict, scan.modules)) {
    if (reported.count(name)) continue;
    out.emplace_back(ErrorCode::ScaleWithoutWeight,
                     quote(name) + " " + shape_to_string(dict.at(name).shape()) +
                         ": FP8 scales without their weight " + quote(*core::fp8_weight_of(name)) +
                         " in the checkpoint; nothing can dequantize with them");
  }
  return out;
}

}  // namespace grouplin::layout
