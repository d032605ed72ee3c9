// Private: FP8 block scaling, in one place: the block GroupLin's FP8 modules and kernels use, the
// block shapes a checkpoint's scales may have and the shape they give, quantization (what an FP8
// GroupedLinear makes of float values) and dequantization, the one rule every reading of codes
// as values follows (convert --dtype, load_state_dict into a float module): each code decoded to
// F32 and multiplied once, in F32, by its block's scale (decoded to F32), then rounded once to the
// output type. That is PyTorch's `(q.float() * scale).to(dtype)`, bit for bit.
//
//   Shape s = core::block_scale_shape(300, 200, {core::kFp8Block, core::kFp8Block});  // [3, 2]
//   core::quantize_blocks(values, codes, scales);  // [out, in] F32 -> E4M3 codes, F32 scales
//   // rows [r0, r0 + n) of a [rows, cols] E4M3 matrix with [128, 128] F32 block scales
//   core::dequantize_rows({codes, DType::F8_E4M3, scales, DType::F32, cols, 128, 128}, r0, n,
//                         out, DType::BF16);
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::core {

// The block of an FP8 GroupedLinear's weights: one F32 scale per kFp8Block x kFp8Block codes
// (DeepSeek-V3's form), as the kernels read them.
inline constexpr int64_t kFp8Block = 128;

// The block shapes of FP8 scales GroupLin knows, in the order they are tried: [128, 128]
// (DeepSeek-V3, Qwen3-FP8), [1, 32] (MXFP8), [] (one scale per matrix: Float8Tensor).
const std::vector<std::vector<int64_t>>& fp8_scale_blocks();
// The scales of a [rows, cols] matrix in `block`: [ceil(rows / r), ceil(cols / c)] for [r, c], [1]
// for {} (one per matrix).
Shape block_scale_shape(int64_t rows, int64_t cols, const std::vector<int64_t>& block);
// "[2, 1] ([128, 128] blocks)", or "[1] (one per <whole>)" for {}: what a message expects.
std::string expected_scales(const Shape& shape, const std::vector<int64_t>& block,
                            std::string_view whole);

// The name of a dense FP8 weight's scales, as checkpoints spell them (transformers' fine-grained
// FP8, DeepSeek-V3): "o_proj.weight" -> "o_proj.weight_scale_inv". Scales of grouped modules are
// paired by their rules instead (StackedTensorRule::scale_of).
std::string fp8_scale_name(std::string_view weight);
// Whether `t` holds FP8 codes whose values need their scales (F8_E4M3, F8_E5M2; not the E8M0
// scales themselves).
inline bool is_fp8(DType t) { return t == DType::F8_E4M3 || t == DType::F8_E5M2; }
// The weight `name` is the scales of by that spelling ("o_proj.weight_scale_inv" ->
// "o_proj.weight"); nullopt for any other name.
std::optional<std::string> fp8_weight_of(std::string_view name);

// `values` [out, in] (F32) quantized per kFp8Block block into `codes` [out, in] (F8_E4M3) and
// `scales` block_scale_shape(out, in, {kFp8Block, kFp8Block}) (F32): scale = the block's largest
// magnitude / 448 (1 for a block of zeros), code = value / scale rounded to nearest even.
void quantize_blocks(const Tensor& values, Tensor codes, Tensor scales);

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
