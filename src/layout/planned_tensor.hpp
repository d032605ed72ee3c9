// Private: a planned tensor, the unit of every plan (conversion, comparison, load): a name, a
// dtype, a shape and the views whose bytes it holds, possibly rearranged or dequantized as it is
// read (layout/planned_reader.hpp runs it). Nothing of a checkpoint is copied by planning.
//
//   PlannedTensor t = PlannedTensor::of("w", tensor);  // one whole piece
//   PlannedTensor e = stacked.select(3);                // expert 3, as views of the pieces
//   t.copy_to(dst);                                     // the bytes, once
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

// How one expert's matrix is stored: in the per-expert orientation [rows, cols] or transposed,
// its rows in order or in `interleave` interleaved groups (StackedTensorRule).
struct MatrixForm {
  bool transposed = false;
  int64_t interleave = 1;
  bool operator==(const MatrixForm&) const = default;
};

// The bytes of a planned tensor when they are not the pieces' bytes in order: the pieces hold
// matrices of rows x cols elements (one per expert, cols = 1 for vectors) one after the other in
// `from` form, and the tensor holds each in `to` form. Only the stacked-only families need it.
struct Rearrangement {
  int64_t rows = 0;
  int64_t cols = 0;
  MatrixForm from;
  MatrixForm to;
};

// FP8 codes to read as their values (ConvertOptions::dtype, load_state_dict into a float
// module): the planned tensor's pieces hold the codes, a stack of matrices [..., rows, cols], and
// `scales` the pieces of their scales, [..., ceil(rows / block_rows), ceil(cols / block_cols)]
// (one per matrix when the block is the whole matrix). Each value is the code decoded to F32
// times its block's scale in F32, rounded once to the planned tensor's dtype.
struct Dequantization {
  DType codes = DType::F8_E4M3;
  DType scale_dtype = DType::F32;
  std::vector<Tensor> scales;
  std::string scales_name;  // the scale entry, for messages ("m.weight_scale_inv")
  int64_t rows = 0, cols = 0;
  int64_t block_rows = 0, block_cols = 0;

  int64_t scale_rows() const { return (rows + block_rows - 1) / block_rows; }
  int64_t scale_cols() const { return (cols + block_cols - 1) / block_cols; }
};

// One tensor of a converted checkpoint: its bytes are the bytes of `pieces`, in order (or
// rearranged, when `rearrange` is set; or dequantized, when `dequantize` is). Every piece is a view
// of the source dict (a whole entry, or a part of one expert of a stacked entry).
struct PlannedTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<Tensor> pieces;
  std::optional<Rearrangement> rearrange{};
  std::optional<Dequantization> dequantize{};
  // For FP8 scales of a grouped module: the name of the planned tensor they scale, as the rule
  // set declares it (StackedTensorRule::scale_of); "" for every other tensor (a dense weight's
  // scales are paired by name: core/fp8.hpp).
  std::string scale_of{};
  // For such scales concatenated from parts (gate_proj's, up_proj's) that do not end on a block
  // boundary, planned only to dequantize their weight (PlanOptions::dequantize): the rows of
  // each part of the weight, whose matrices the scales cover one part at a time; 0 otherwise.
  int64_t part_rows = 0;

  // Bytes of the tensor (the sum of the pieces' bytes; of the values for a dequantized one).
  uint64_t nbytes() const;
  size_t rank() const { return shape.size(); }
  // Size of dimension d; Requires: d < rank().
  int64_t dim(size_t d) const { return shape[d]; }
  // Slice i along dim 0 (rank drops by one), as views of the pieces that hold its bytes. Throws
  // Error(OutOfBounds); a rearranged tensor can only be sliced by expert (dim 0 is the experts).
  PlannedTensor select(int64_t i) const;
  // Copies the bytes of the pieces (rearranged) into `dst` (same element count; float dtypes
  // convert as Tensor::copy_from does). Throws as Tensor::copy_from.
  void copy_to(Tensor& dst) const;
  // A plan of one whole tensor.
  static PlannedTensor of(std::string name, const Tensor& t);
};

// Planned tensors by name, in order: what load_state_dict reads (a state dict as it is, or a
// checkpoint seen through layout rules).
class PlannedDict {
 public:
  PlannedDict() = default;
  // Each entry of `dict` as one whole piece.
  explicit PlannedDict(const StateDict& dict);
  // Throws Error(DuplicateName) for a name given twice.
  explicit PlannedDict(std::vector<PlannedTensor> tensors);

  const PlannedTensor* find(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  std::vector<PlannedTensor>::const_iterator begin() const { return tensors_.begin(); }
  std::vector<PlannedTensor>::const_iterator end() const { return tensors_.end(); }

 private:
  std::vector<PlannedTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace grouplin
