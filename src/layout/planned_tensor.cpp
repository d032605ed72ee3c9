// PlannedTensor's views and copies (include/grouplin/checkpoint_layout.hpp).
#include "layout/planned_tensor.hpp"

#include <algorithm>
#include <span>
#include <vector>

#include "core/storage_stats.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "layout/planned_reader.hpp"

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

// Values converted to another dtype are staged this many bytes at a time.
constexpr int64_t kCopyChunkBytes = int64_t{256} << 10;

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
  // The plan's one executor (layout/planned_reader.hpp) over memory: straight into dst when it
  // has the planned dtype, else a chunk at a time (the pieces themselves where they are plain),
  // converted as Tensor::copy_from converts. Either way each byte of dst is counted as copied once
  // (the load tests' instrumentation, core/storage_stats.hpp), and nothing is allocated as a
  // Storage.
  if (dst.numel() == 0) return;
  const layout::MemoryPieces memory;
  layout::PlannedReader reader(memory, *this);
  Tensor flat = dst.reshape({dst.numel()});
  if (dst.dtype() == dtype) {
    reader.read(std::span(flat.mutable_data(), static_cast<size_t>(flat.nbytes())));
    detail::count_copied_bytes(flat.nbytes());
    return;
  }
  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  int64_t at = 0;
  reader.visit(kCopyChunkBytes, [&](std::span<const std::byte> bytes) {
    const auto n = static_cast<int64_t>(bytes.size()) / esize;
    const Tensor chunk =
        Tensor::view_of(Storage::wrap(bytes.data(), bytes.size(), nullptr), 0, {n}, dtype);
    flat.rows(at, n).copy_from(chunk);
    at += n;
  });
}

}  // namespace grouplin
