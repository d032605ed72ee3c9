// RowsAhead (src/kernels/rows_ahead.hpp): the lines the dot and row kernels prefetch, in the order
// they prefetch them, never past the last row walked or into the gaps between rows.
#include "kernels/rows_ahead.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace grouplin::kernels {
namespace {

// Every line RowsAhead walks, as offsets from the first row, stepping until it stops.
std::vector<int64_t> walk(const char* base, int64_t ld, int64_t row_bytes, int64_t rows,
                          int64_t ahead) {
  RowsAhead r(base, ld, row_bytes, rows, ahead);
  std::vector<int64_t> lines;
  while (r.line() != nullptr && lines.size() < 10000) {
    lines.push_back(r.line() - base);
    r.step();
  }
  return lines;
}

// The lines of rows of `row_bytes` bytes, `ld` apart, in address order, from the `skip`-th on.
std::vector<int64_t> lines_of(int64_t ld, int64_t row_bytes, int64_t rows, int64_t skip) {
  std::vector<int64_t> lines;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t at = 0; at < row_bytes; at += 64) lines.push_back(r * ld + at);
  lines.erase(lines.begin(), lines.begin() + std::min<int64_t>(skip, std::ssize(lines)));
  return lines;
}

TEST(RowsAhead, WalksTheRowsLinesInOrderFromTheDistanceAhead) {
  const std::vector<char> m(64 * 1024);
  // Rows of whole lines, rows with a ragged last line, rows with gaps between them (ld > bytes).
  for (const auto& [ld, row_bytes] : {std::pair<int64_t, int64_t>{4096, 4096},
                                      {1536, 1536},
                                      {3000, 2050},
                                      {2048, 100},
                                      {64, 64}}) {
    for (const int64_t ahead : {int64_t{0}, int64_t{64}, int64_t{8192}}) {
      const int64_t rows = 5;
      const int64_t lines_per_row = (row_bytes + 63) / 64;
      EXPECT_EQ(walk(m.data(), ld, row_bytes, rows, ahead),
                lines_of(ld, row_bytes, rows, ahead / 64))
          << "ld " << ld << ", row bytes " << row_bytes << ", ahead " << ahead << " ("
          << lines_per_row << " lines a row)";
    }
  }
}

TEST(RowsAhead, WithoutRowsEveryStepDoesNothing) {
  const std::vector<char> m(4096);
  RowsAhead none(m.data(), 2048, 2048, 0, 0);
  EXPECT_EQ(none.line(), nullptr);
  none.step();
  EXPECT_EQ(none.line(), nullptr);
  // A distance past the last row leaves nothing to prefetch.
  EXPECT_EQ(RowsAhead(m.data(), 1024, 1024, 2, 8192).line(), nullptr);
}

}  // namespace
}  // namespace grouplin::kernels
