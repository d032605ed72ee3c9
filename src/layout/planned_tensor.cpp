// PlannedTensor's views and copies (include/grouplin/checkpoint_layout.hpp).
#include <cstring>
#include <vector>

#include "core/fp8.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "layout/rearrange.hpp"

namespace grouplin {
namespace {

// The pieces' bytes [begin, begin + n) (in elements) as views, in order.
std::vector<Tensor> piece_range(const std::vector<Tensor>& pieces, int64_t begin, int64_t n) {
  std::vector<Tensor> out;
  for (const Tensor& piece : pieces) {
    if (n == 0) break;
    const int64_t size = piece.numel();
    if (begin >= size) {
      begin -= size;
      continue;
    }
    const int64_t take = std::min(n, size - begin);
    out.push_back(piece.reshape({size}).rows(begin, take));
    n -= take;
    begin = 0;
  }
  return out;
}

// Copies the pieces' bytes, in order, into `dst` (which holds exactly that many).
void gather(const std::vector<Tensor>& pieces, std::byte* dst) {
  for (const Tensor& p : pieces) {
    if (p.nbytes() == 0) continue;
    std::memcpy(dst, p.data(), p.nbytes());
    dst += p.nbytes();
  }
}

}  // namespace

PlannedTensor PlannedTensor::select(int64_t i) const {
  if (shape.empty() || i < 0 || i >= shape[0]) {
    throw Error(ErrorCode::OutOfBounds, "select(" + std::to_string(i) + ") on planned tensor " +
                                            quote(name) + " of shape " + shape_to_string(shape));
  }
  PlannedTensor out{name, dtype, Shape(shape.begin() + 1, shape.end()), {}, rearrange, dequantize};
  const int64_t slab = shape_numel(out.shape);
  if (dequantize) {  // codes and scales of whole matrices
    const Dequantization& d = *dequantize;
    if (slab % (d.rows * d.cols) != 0) {
      throw Error(ErrorCode::OutOfBounds, "select(" + std::to_string(i) + ") on planned tensor " +
                                              quote(name) + ": its dim 0 is not its matrices");
    }
    const int64_t matrices = slab / (d.rows * d.cols);
    const int64_t scale_slab = matrices * d.scale_rows() * d.scale_cols();
    out.dequantize->scales = piece_range(d.scales, i * scale_slab, scale_slab);
  }
  if (rearrange && slab != rearrange->rows * rearrange->cols) {
    throw Error(ErrorCode::OutOfBounds, "select(" + std::to_string(i) + ") on planned tensor " +
                                            quote(name) + ": its dim 0 is not its experts");
  }
  out.pieces = piece_range(pieces, i * slab, slab);
  return out;
}

void PlannedTensor::copy_to(Tensor& dst) const {
  if (shape_numel(shape) != dst.numel()) {
    throw Error(ErrorCode::ShapeMismatch, "copying planned tensor " + quote(name) + " " +
                                              shape_to_string(shape) + " into " +
                                              shape_to_string(dst.shape()));
  }
  Tensor flat = dst.reshape({dst.numel()});
  if (dequantize) {
    // Matrix by matrix: codes and scales gathered, values computed in F32, copied (and rounded
    // to dst's dtype) into place. Rounding F32 once is the rule, whatever dst's float type.
    const Dequantization& d = *dequantize;
    const int64_t block = d.rows * d.cols;
    const int64_t scale_block = d.scale_rows() * d.scale_cols();
    std::vector<std::byte> codes(static_cast<size_t>(block));
    std::vector<std::byte> scales(static_cast<size_t>(scale_block) * dtype_size(d.scale_dtype));
    Tensor values = Tensor::zeros({block}, DType::F32);
    for (int64_t m = 0; m * block < dst.numel(); ++m) {
      gather(piece_range(pieces, m * block, block), codes.data());
      gather(piece_range(d.scales, m * scale_block, scale_block), scales.data());
      core::dequantize_rows(
          {codes.data(), d.codes, scales.data(), d.scale_dtype, d.cols, d.block_rows, d.block_cols},
          0, d.rows, values.mutable_data(), DType::F32);
      flat.rows(m * block, block).copy_from(values);
    }
    return;
  }
  if (!rearrange) {
    int64_t at = 0;
    for (const Tensor& piece : pieces) {
      flat.rows(at, piece.numel()).copy_from(piece);
      at += piece.numel();
    }
    return;
  }
  // Block by block (one expert each): gathered, moved into the target form, then copied (and
  // converted, when dst has another float dtype) into place.
  const int64_t block = rearrange->rows * rearrange->cols;
  const size_t esize = dtype_size(dtype);
  std::vector<std::byte> stored(static_cast<size_t>(block) * esize);
  Tensor moved = Tensor::zeros({block}, dtype);
  for (int64_t at = 0; at < dst.numel(); at += block) {
    gather(piece_range(pieces, at, block), stored.data());
    layout::rearrange_block(stored.data(), moved.mutable_data(), *rearrange, esize);
    flat.rows(at, block).copy_from(moved);
  }
}

}  // namespace grouplin
