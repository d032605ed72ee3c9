// Private: FP8 codes times their block scales, the one rule every dequantization in GroupLin
// follows (convert --dtype, load_state_dict into a float module): each code decoded to F32 and
// multiplied once, in F32, by its block's scale (decoded to F32), then rounded once to the
// output type. That is PyTorch's `(q.float() * scale).to(dtype)`, bit for bit.
//
//   // rows [r0, r0 + n) of a [rows, cols] E4M3 matrix with [128, 128] F32 block scales
//   core::dequantize_rows({codes, DType::F8_E4M3, scales, DType::F32, cols, 128, 128}, r0, n,
//                         out, DType::BF16);
#pragma once

#include <cstddef>
#include <cstdint>

#include "grouplin/dtype.hpp"

namespace grouplin::core {

struct QuantizedRows {
  const std::byte* codes;  // row r0's first code; rows are `cols` codes apart
  DType code_type;         // F8_E4M3 or F8_E5M2
  // The scale row of r0's block, first; scale rows are ceil(cols / block_cols) apart.
  const std::byte* scales;
  DType scale_type;  // any float type (F32, BF16, F8_E8M0, ...)
  int64_t cols;
  int64_t block_rows;  // rows sharing one scale row
  int64_t block_cols;  // columns sharing one scale
};

// Writes rows [first_row, first_row + n) of `q` (counted within the matrix, so that block
// boundaries fall where they do in it) to `out` as `out_type` (F32, BF16 or F16), n * q.cols
// elements. Requires: q.codes at row first_row, q.scales at scale row first_row / q.block_rows.
void dequantize_rows(const QuantizedRows& q, int64_t first_row, int64_t n, std::byte* out,
                     DType out_type);

}  // namespace grouplin::core
