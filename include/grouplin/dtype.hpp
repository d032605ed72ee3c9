// Element types and exact scalar conversions.
//
//   grouplin::DType t = grouplin::DType::BF16;
//   size_t bytes = grouplin::dtype_size(t);               // 2
//   uint16_t b = grouplin::f32_to_bf16(1.0f / 3.0f);       // round to nearest even
//   float back = grouplin::bf16_to_f32(b);
//   auto parsed = grouplin::dtype_from_name("F8_E4M3");     // as safetensors spells it
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace grouplin {

// Float types GroupLin computes with, plus the integer and byte types that checkpoints carry
// and GroupLin passes through unchanged.
enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  F8_E4M3,  // "e4m3fn": no infinities, NaN is S.1111.111, max 448
  F8_E5M2,  // IEEE-like: infinities and NaNs, max 57344
  F8_E8M0,  // "e8m0fnu": MX block scales, 2^(bits - 127); no sign, no zero, 0xFF is NaN
  F64,
  BOOL,
  U8,
  I8,
  I16,
  U16,
  I32,
  U32,
  I64,
  U64,
};

inline constexpr DType kAllDTypes[] = {
    DType::F32, DType::F16,  DType::BF16, DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0,
    DType::F64, DType::BOOL, DType::U8,   DType::I8,      DType::I16,     DType::U16,
    DType::I32, DType::U32,  DType::I64,  DType::U64,
};

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling: "F32", "BF16", "F8_E4M3", "BOOL", ...
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; nullopt for anything else (case-sensitive).
std::optional<DType> dtype_from_name(std::string_view name);
// True for F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0 and F64.
bool is_float(DType t);

// Scalar conversions. Narrowing rounds once to nearest, ties to even, bit for bit as ml_dtypes
// does from F32: NaN becomes the quiet NaN of the target with the input's sign; BF16, F16 and
// F8_E5M2 overflow to infinity; F8_E4M3 (no infinity) rounds magnitudes up to 464 to 448 and
// those beyond to NaN; F8_E8M0 (powers of two) rounds up from 1.5 x 2^e, turns zero, negatives,
// infinities and magnitudes from 1.5 x 2^127 up into its NaN, magnitudes up to 2^-127 into
// 2^-127 and those between 2^-127 and 2^-126 into 2^-126 (as ml_dtypes 0.5.1). Widening is exact.
// (bf16_to_f32 and f32_to_bf16 are inline: the kernels' packing loops call them per element,
// where a call measured costly: docs/PERFORMANCE.md.)
inline float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }
inline uint16_t f32_to_bf16(float value) {
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest even in one add; a carry moves into
  // the exponent, up to infinity. Only NaN needs its own case (the add could turn it into inf).
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7fc0u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
float f8e4m3_to_f32(uint8_t bits);
uint8_t f32_to_f8e4m3(float value);
float f8e5m2_to_f32(uint8_t bits);
uint8_t f32_to_f8e5m2(float value);
float f8e8m0_to_f32(uint8_t bits);
uint8_t f32_to_f8e8m0(float value);

// Converts n elements between two float dtypes (F64 included; same dtype is a plain copy).
// F64 sources are rounded once, directly (ml_dtypes rounds them twice, through F32).
// Throws Error(UnsupportedConversion) if either type is not a float type.
// Requires: src holds n elements of `from`, dst has room for n elements of `to`; no overlap.
void convert_elements(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace grouplin
