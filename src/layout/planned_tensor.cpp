// PlannedTensor's views and copies (include/grouplin/checkpoint_layout.hpp).
#include <cstring>
#include <vector>

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
  PlannedTensor out{name, dtype, Shape(shape.begin() + 1, shape.end()), {}, rearrange};
  const int64_t slab = shape_numel(out.shape);
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
