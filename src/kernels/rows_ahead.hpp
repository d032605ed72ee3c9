// Software prefetch of weight rows, walked a cache line at a time in address order, each step
// prefetching one line into L2. Two uses:
// - the dot kernels that read weight rows along the depth, one row after another (dot_tile_pairs,
//   dot_tile_fp8_pairs): the call's rows, a fixed distance ahead of the line being read;
// - the row kernels that read a block of weight rows down its columns (fma_rows_pairs,
//   fma_rows_fp8_pairs): the next block, from its start, along its rows (one stream), a line per
//   line read.
//
//   RowsAhead ahead(w, ld_bytes, row_bytes, rows, kDotAheadBytes);  // or ahead 0: the next block
//   for each 64 bytes read: ahead.step();
//
// Why, for the dot kernels: with 4-6 rows of x per weight row the products take about as long as
// the weights' stream, and with the hardware prefetchers alone the core stalls on the weights and
// then computes without reading; prefetching ahead overlaps the two. With 1-3 rows the products
// keep pace with the hardware prefetchers, and prefetching as well only costs (docs/PERFORMANCE.md,
// "Weight rows prefetched ahead into L2").
#pragma once

#include <cstdint>

namespace grouplin::kernels {

// How far ahead, in bytes of the weights (BF16 or FP8 codes alike).
inline constexpr int64_t kDotAheadBytes = 8192;
// The fewest rows of x per call for which the dot kernels step the walk (decided at compile time,
// by the kernels' row count: with fewer, they run no extra instruction).
inline constexpr int kDotAheadMinRows = 4;

class RowsAhead {
 public:
  // `rows` rows of `row_bytes` bytes, `ld_bytes` apart, from first_row; the walk starts `ahead`
  // bytes (whole lines) into them. No rows left: every step does nothing.
  RowsAhead(const void* first_row, int64_t ld_bytes, int64_t row_bytes, int64_t rows, int64_t ahead)
      : row_(static_cast<const char*>(first_row)), ld_bytes_(ld_bytes), row_bytes_(row_bytes) {
    const int64_t lines_per_row = row_bytes > 64 ? (row_bytes + 63) / 64 : 1;
    const int64_t skipped_rows = ahead / 64 / lines_per_row;
    rows_left_ = rows - skipped_rows;
    if (rows_left_ > 0) {
      row_ += skipped_rows * ld_bytes;
      at_ = ahead / 64 % lines_per_row * 64;
    }
  }
  // A walk over no rows, for the calls that must not prefetch: every step does nothing.
  static RowsAhead none() { return RowsAhead(nullptr, 0, 64, 0, 0); }
  // The line the next step prefetches, or null once the walk has passed the last row.
  const char* line() const { return rows_left_ > 0 ? row_ + at_ : nullptr; }
  void step() {
    if (rows_left_ <= 0) return;
    __builtin_prefetch(row_ + at_, 0, 2);
    advance();
  }

 private:
  void advance() {
    at_ += 64;
    if (at_ >= row_bytes_) {
      at_ = 0;
      row_ += ld_bytes_;
      --rows_left_;
    }
  }
  const char* row_;  // the row of the next line
  int64_t ld_bytes_, row_bytes_, rows_left_ = 0;
  int64_t at_ = 0;  // the next line's offset in its row
};

}  // namespace grouplin::kernels
