#include "io/planned_reader.hpp"

#include <algorithm>
#include <cstring>

#include "layout/rearrange.hpp"

namespace grouplin::detail {

PlannedReader::PlannedReader(const CheckpointSource& src, const PlannedTensor& t)
    : src_(src), t_(t), total_(t.nbytes()) {
  if (t.rearrange) {
    block_bytes_ = layout::block_bytes(*t.rearrange, dtype_size(t.dtype));
    stored_.resize(block_bytes_);
    moved_.resize(block_bytes_);
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

void PlannedReader::read(std::span<std::byte> dst) {
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

}  // namespace grouplin::detail
