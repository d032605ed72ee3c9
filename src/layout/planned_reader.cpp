// The one executor of a plan (layout/planned_reader.hpp).
#include "layout/planned_reader.hpp"

#include <algorithm>
#include <cstring>

#include "core/fp8.hpp"
#include "layout/planned_tensor.hpp"
#include "layout/rearrange.hpp"

namespace grouplin::layout {
namespace {

// Values of about this many bytes are computed at a time from a dequantized tensor.
constexpr int64_t kDequantizedChunkBytes = int64_t{4} << 20;

// Bytes [at, at + dst.size()) of `pieces` taken one after the other.
void read_range(const PieceSource& src, const std::vector<Tensor>& pieces, uint64_t at,
                std::span<std::byte> dst) {
  for (const Tensor& p : pieces) {
    if (dst.empty()) return;
    if (at >= p.nbytes()) {
      at -= p.nbytes();
      continue;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), p.nbytes() - at));
    src.read(p, at, dst.first(n));
    dst = dst.subspan(n);
    at = 0;
  }
}

}  // namespace

void MemoryPieces::read(const Tensor& piece, uint64_t at, std::span<std::byte> dst) const {
  if (!dst.empty()) std::memcpy(dst.data(), piece.data() + at, dst.size());
}

PlannedReader::PlannedReader(const PieceSource& src, const PlannedTensor& t)
    : src_(src), t_(t), total_(t.nbytes()) {
  if (t.rearrange) {
    block_bytes_ = layout::block_bytes(*t.rearrange, dtype_size(t.dtype));
    stored_.resize(block_bytes_);
    moved_.resize(block_bytes_);
  }
  if (t.dequantize) {
    const Dequantization& d = *t.dequantize;
    const auto row_bytes = static_cast<int64_t>(d.cols * dtype_size(t.dtype));
    chunk_rows_ = std::max<int64_t>(1, kDequantizedChunkBytes / std::max<int64_t>(row_bytes, 1));
    if (d.block_rows < d.rows) {  // whole scale blocks per chunk
      chunk_rows_ = std::max(d.block_rows, chunk_rows_ / d.block_rows * d.block_rows);
    }
    chunk_rows_ = std::min(chunk_rows_, std::max<int64_t>(d.rows, 1));
    const int64_t scale_rows = (chunk_rows_ + d.block_rows - 1) / d.block_rows + 1;
    stored_.resize(static_cast<size_t>(chunk_rows_ * d.cols));
    moved_.resize(static_cast<size_t>(chunk_rows_ * row_bytes));
    scales_.resize(static_cast<size_t>(scale_rows * d.scale_cols()) * dtype_size(d.scale_dtype));
  }
}

void PlannedReader::read_dequantized(std::span<std::byte> dst) {
  const Dequantization& d = *t_.dequantize;
  const uint64_t row_bytes = static_cast<uint64_t>(d.cols) * dtype_size(t_.dtype);
  const uint64_t matrix_bytes = static_cast<uint64_t>(d.rows) * row_bytes;
  const size_t scale_size = dtype_size(d.scale_dtype);
  while (!dst.empty()) {
    const uint64_t m = done_ / matrix_bytes;
    const auto row = static_cast<int64_t>(done_ % matrix_bytes / row_bytes);
    const int64_t r0 = row / chunk_rows_ * chunk_rows_;
    const int64_t n = std::min(chunk_rows_, d.rows - r0);
    const uint64_t chunk_at = m * matrix_bytes + static_cast<uint64_t>(r0) * row_bytes;
    if (chunk_at != block_at_) {
      const auto first_code = (m * static_cast<uint64_t>(d.rows) + static_cast<uint64_t>(r0)) *
                              static_cast<uint64_t>(d.cols);
      read_range(src_, t_.pieces, first_code,
                 std::span(stored_).first(static_cast<size_t>(n * d.cols)));
      const int64_t first_scale_row = r0 / d.block_rows;
      const int64_t scale_rows = (r0 + n - 1) / d.block_rows - first_scale_row + 1;
      const auto first_scale =
          (m * static_cast<uint64_t>(d.scale_rows()) + static_cast<uint64_t>(first_scale_row)) *
          static_cast<uint64_t>(d.scale_cols());
      read_range(
          src_, d.scales, first_scale * scale_size,
          std::span(scales_).first(static_cast<size_t>(scale_rows * d.scale_cols()) * scale_size));
      core::dequantize_rows({stored_.data(), d.codes, scales_.data(), d.scale_dtype, d.cols,
                             d.block_rows, d.block_cols},
                            r0, n, moved_.data(), t_.dtype);
      block_at_ = chunk_at;
    }
    const uint64_t in_chunk = done_ - chunk_at;
    const size_t take =
        static_cast<size_t>(std::min<uint64_t>(dst.size(), n * row_bytes - in_chunk));
    std::memcpy(dst.data(), moved_.data() + in_chunk, take);
    dst = dst.subspan(take);
    done_ += take;
  }
}

void PlannedReader::read_pieces(uint64_t at, std::span<std::byte> dst) {
  // Pieces are read in order: find the one holding `at` from the last position.
  if (at < piece_at_) {
    piece_ = 0;
    piece_at_ = 0;
  }
  while (!dst.empty()) {
    const Tensor& p = t_.pieces[piece_];
    const uint64_t in_piece = at - piece_at_;
    if (in_piece >= p.nbytes()) {
      piece_at_ += p.nbytes();
      ++piece_;
      continue;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), p.nbytes() - in_piece));
    src_.read(p, in_piece, dst.first(n));
    dst = dst.subspan(n);
    at += n;
  }
}

void PlannedReader::visit(size_t max_bytes,
                          const std::function<void(std::span<const std::byte>)>& fn) {
  const size_t esize = dtype_size(t_.dtype);
  max_bytes = std::max(esize, max_bytes / esize * esize);
  const bool plain = !t_.dequantize && !t_.rearrange;
  if (plain && !t_.pieces.empty() && src_.direct(t_.pieces.front()) != nullptr) {
    uint64_t at = 0;  // first byte of the current piece
    for (const Tensor& p : t_.pieces) {
      const uint64_t end = at + p.nbytes();
      for (uint64_t b = std::max(at, done_); b < end; b += max_bytes) {
        const auto n = static_cast<size_t>(std::min<uint64_t>(max_bytes, end - b));
        fn(std::span(src_.direct(p) + (b - at), n));
        done_ = b + n;
      }
      at = end;
    }
    return;
  }
  std::vector<std::byte> buffer(static_cast<size_t>(std::min<uint64_t>(max_bytes, left())));
  while (left() > 0) {
    const auto n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), left()));
    read(std::span(buffer.data(), n));
    fn(std::span<const std::byte>(buffer.data(), n));
  }
}

void PlannedReader::read(std::span<std::byte> dst) {
  if (t_.dequantize) return read_dequantized(dst);
  if (!t_.rearrange) {
    read_pieces(done_, dst);
    done_ += dst.size();
    return;
  }
  while (!dst.empty()) {
    const uint64_t block_at = done_ / block_bytes_ * block_bytes_;
    if (block_at != block_at_) {
      read_pieces(block_at, stored_);
      layout::rearrange_block(stored_.data(), moved_.data(), *t_.rearrange, dtype_size(t_.dtype));
      block_at_ = block_at;
    }
    const uint64_t in_block = done_ - block_at;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), block_bytes_ - in_block));
    std::memcpy(dst.data(), moved_.data() + in_block, n);
    dst = dst.subspan(n);
    done_ += n;
  }
}

}  // namespace grouplin::layout
