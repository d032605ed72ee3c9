// Private: moving one expert's matrix between its storage forms (MatrixForm in
// include/grouplin/checkpoint_layout.hpp): transposed or not, rows in order or interleaved.
//
//   // gpt-oss gate_up_proj expert [H, 2I] (transposed, interleaved) -> TE's weight [2I, H]
//   layout::rearrange_block(src, dst, {.rows = 2 * I, .cols = H, .from = {true, 2}, .to = {}}, 2);
#pragma once

#include <cstddef>
#include <cstdint>

#include "grouplin/checkpoint_layout.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::layout {

// Bytes of one block (one expert's matrix) of `r` with elements of `element_size` bytes.
uint64_t block_bytes(const Rearrangement& r, size_t element_size);

// Writes the block at `src` (in r.from form) to `dst` (in r.to form): element (row, col) of the
// matrix in the per-expert orientation moves from its place in one form to its place in the
// other. Requires: both hold block_bytes(r, element_size) bytes and do not overlap;
// element_size is 1, 2, 4 or 8; rows divisible by both forms' interleave.
void rearrange_block(const std::byte* src, std::byte* dst, const Rearrangement& r,
                     size_t element_size);

}  // namespace grouplin::layout
