#include "layout/rearrange.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "layout/planned_tensor.hpp"

namespace grouplin::layout {
namespace {

// Where row r of the matrix sits among the stored rows: group g = r / (rows / k) of k
// interleaved groups puts its j-th row at j * k + g.
int64_t stored_row(int64_t r, int64_t rows, int64_t k) {
  if (k <= 1) return r;
  const int64_t per_group = rows / k;
  return (r % per_group) * k + r / per_group;
}

// Element offset of (row, col) in `f` for a rows x cols matrix.
int64_t offset(const MatrixForm& f, int64_t stored, int64_t col, int64_t rows, int64_t cols) {
  return f.transposed ? col * rows + stored : stored * cols + col;
}

// N-byte elements copied with memcpy: one load and one store each, at any alignment (blocks come
// from files at any offset).
template <size_t N>
void move_elements(const std::byte* src, std::byte* dst, const Rearrangement& r) {
  // Tiles of 32 x 32 elements keep both the strided reads and the strided writes of a transpose
  // within the L1 cache.
  constexpr int64_t kTile = 32;
  std::vector<int64_t> from_row(static_cast<size_t>(r.rows)), to_row(static_cast<size_t>(r.rows));
  for (int64_t i = 0; i < r.rows; ++i) {
    from_row[static_cast<size_t>(i)] = stored_row(i, r.rows, r.from.interleave);
    to_row[static_cast<size_t>(i)] = stored_row(i, r.rows, r.to.interleave);
  }
  for (int64_t i0 = 0; i0 < r.rows; i0 += kTile) {
    for (int64_t c0 = 0; c0 < r.cols; c0 += kTile) {
      const int64_t i1 = std::min(r.rows, i0 + kTile), c1 = std::min(r.cols, c0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t fr = from_row[static_cast<size_t>(i)], tr = to_row[static_cast<size_t>(i)];
        for (int64_t c = c0; c < c1; ++c) {
          std::memcpy(dst + offset(r.to, tr, c, r.rows, r.cols) * N,
                      src + offset(r.from, fr, c, r.rows, r.cols) * N, N);
        }
      }
    }
  }
}

}  // namespace

uint64_t block_bytes(const Rearrangement& r, size_t element_size) {
  return static_cast<uint64_t>(r.rows) * static_cast<uint64_t>(r.cols) * element_size;
}

void rearrange_block(const std::byte* src, std::byte* dst, const Rearrangement& r,
                     size_t element_size) {
  switch (element_size) {
    case 1:
      return move_elements<1>(src, dst, r);
    case 2:
      return move_elements<2>(src, dst, r);
    case 4:
      return move_elements<4>(src, dst, r);
    default:
      return move_elements<8>(src, dst, r);
  }
}

}  // namespace grouplin::layout
