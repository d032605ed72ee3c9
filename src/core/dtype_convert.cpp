// Exact conversions between the float element types.
//
// Narrowing rounds once, to nearest with ties to even, straight from the source value: F64 is
// never rounded to F32 first (that would round twice and can land one ulp off). From F32 the
// results match ml_dtypes (numpy for F16) bit for bit; every narrowing returns the canonical
// quiet NaN with the input's sign. From F64 they differ from ml_dtypes (0.5.1), which does round
// F64 to F32 first. tests/core/dtype_test.cpp checks every bit pattern and every tie.
//
// The narrow formats, as sign | exponent | fraction bits (bias in brackets):
//   BF16     1 | 8 | 7  (127)   IEEE-like, F32 with the low 16 bits cut off
//   F16      1 | 5 | 10 (15)    IEEE binary16
//   F8_E5M2  1 | 5 | 2  (15)    IEEE-like, F16 with the low 8 bits cut off
//   F8_E4M3  1 | 4 | 3  (7)     "fn": no infinities; S.1111.111 is NaN; max 448
//   F8_E8M0  0 | 8 | 0  (127)   MX scales: powers of two only, no zero; 0xFF is NaN

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"

namespace grouplin {

namespace {

constexpr uint32_t kF32SignBit = 0x80000000u;
constexpr uint32_t kF32Infinity = 0x7f800000u;
constexpr uint32_t kF32QuietNaN = 0x7fc00000u;
constexpr uint64_t kF64SignBit = 0x8000000000000000ull;
constexpr uint64_t kF64Infinity = 0x7ff0000000000000ull;

// What the rounding helpers need to know about a narrow format.
struct NarrowFormat {
  uint32_t fraction_bits;
  uint32_t exponent_bias;
  uint32_t sign_bit;
  // The smallest magnitude (as F32 / F64 bits) that no longer rounds to a finite value.
  uint32_t overflow_from_f32;
  uint64_t overflow_from_f64;
  // What such a magnitude becomes: +infinity, or +NaN for F8_E4M3, which has no infinity.
  uint32_t overflow_result;
  uint32_t quiet_nan;
};

// Max 0x1.fep127 (BF16 0x7F7F); 0x1.ffp127, half an ulp above, ties to even: infinity.
constexpr NarrowFormat kBF16 = {
    .fraction_bits = 7,
    .exponent_bias = 127,
    .sign_bit = 0x8000,
    .overflow_from_f32 = std::bit_cast<uint32_t>(0x1.ffp127f),
    .overflow_from_f64 = std::bit_cast<uint64_t>(0x1.ffp127),
    .overflow_result = 0x7f80,
    .quiet_nan = 0x7fc0,
};
// Max 65504; 65520 = 65504 + half an ulp (16) ties to even, which is infinity.
constexpr NarrowFormat kF16 = {
    .fraction_bits = 10,
    .exponent_bias = 15,
    .sign_bit = 0x8000,
    .overflow_from_f32 = std::bit_cast<uint32_t>(65520.0f),
    .overflow_from_f64 = std::bit_cast<uint64_t>(65520.0),
    .overflow_result = 0x7c00,
    .quiet_nan = 0x7e00,
};
// Max 57344; 61440 = 57344 + half an ulp (4096) ties to even, which is infinity.
constexpr NarrowFormat kF8E5M2 = {
    .fraction_bits = 2,
    .exponent_bias = 15,
    .sign_bit = 0x80,
    .overflow_from_f32 = std::bit_cast<uint32_t>(61440.0f),
    .overflow_from_f64 = std::bit_cast<uint64_t>(61440.0),
    .overflow_result = 0x7c,
    .quiet_nan = 0x7e,
};
// Max 448 (0x7E). 464 is the tie between 448 and 480, whose pattern 0x7F is NaN: it rounds to
// even, 448, so only magnitudes strictly above 464 overflow, and they become NaN (as ml_dtypes).
constexpr NarrowFormat kF8E4M3 = {
    .fraction_bits = 3,
    .exponent_bias = 7,
    .sign_bit = 0x80,
    .overflow_from_f32 = std::bit_cast<uint32_t>(464.0f) + 1,
    .overflow_from_f64 = std::bit_cast<uint64_t>(464.0) + 1,
    .overflow_result = 0x7f,
    .quiet_nan = 0x7f,
};

// value >> shift, rounded to nearest with ties to even. Requires 1 <= shift and that
// value + 2^(shift-1) does not overflow.
inline uint32_t shift_right_rounded(uint32_t value, uint32_t shift) {
  const uint32_t lowest_kept = (value >> shift) & 1;
  return (value + (1u << (shift - 1)) - 1 + lowest_kept) >> shift;
}

inline uint64_t shift_right_rounded(uint64_t value, uint32_t shift) {
  const uint64_t lowest_kept = (value >> shift) & 1;
  return (value + (uint64_t{1} << (shift - 1)) - 1 + lowest_kept) >> shift;
}

// Rounds a finite F32 magnitude below f.overflow_from_f32 to f; returns the bits without sign.
inline uint32_t round_f32_magnitude(uint32_t magnitude, const NarrowFormat& f) {
  const uint32_t dropped_bits = 23 - f.fraction_bits;
  const uint32_t exponent = magnitude >> 23;
  if (exponent >= 128 - f.exponent_bias) {
    // Normal in f: re-bias the exponent and round the fraction. A carry out of the fraction
    // moves into the exponent, which is the right answer.
    const uint32_t rebiased = magnitude - ((127 - f.exponent_bias) << 23);
    return shift_right_rounded(rebiased, dropped_bits);
  }
  // Subnormal or zero in f. The value is significand * 2^(exponent - 150) and f's unit is
  // 2^(1 - bias - fraction_bits); a quotient of 2^fraction_bits is f's smallest normal.
  uint32_t significand = magnitude & 0x7fffff;
  uint32_t unbiased = exponent;
  if (exponent == 0) {
    unbiased = 1;  // F32 subnormal
  } else {
    significand |= 0x800000;
  }
  const uint32_t shift = 151 - f.exponent_bias - f.fraction_bits - unbiased;
  if (shift > 24) return 0;  // below half of f's smallest subnormal
  return shift_right_rounded(significand, shift);
}

// Rounds a finite F64 magnitude below f.overflow_from_f64 to f; returns the bits without sign.
inline uint32_t round_f64_magnitude(uint64_t magnitude, const NarrowFormat& f) {
  const uint32_t dropped_bits = 52 - f.fraction_bits;
  const uint64_t exponent = magnitude >> 52;
  if (exponent >= 1024 - f.exponent_bias) {
    const uint64_t rebiased = magnitude - (uint64_t{1023 - f.exponent_bias} << 52);
    return static_cast<uint32_t>(shift_right_rounded(rebiased, dropped_bits));
  }
  uint64_t significand = magnitude & 0xfffffffffffffull;
  uint64_t unbiased = exponent;
  if (exponent == 0) {
    unbiased = 1;
  } else {
    significand |= uint64_t{1} << 52;
  }
  const uint64_t shift = 1076 - f.exponent_bias - f.fraction_bits - unbiased;
  if (shift > 53) return 0;
  return static_cast<uint32_t>(shift_right_rounded(significand, static_cast<uint32_t>(shift)));
}

inline uint32_t narrow_from_f32(float value, const NarrowFormat& f) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits & kF32SignBit) ? f.sign_bit : 0;
  const uint32_t magnitude = bits & ~kF32SignBit;
  if (magnitude > kF32Infinity) return sign | f.quiet_nan;
  if (magnitude >= f.overflow_from_f32) return sign | f.overflow_result;
  return sign | round_f32_magnitude(magnitude, f);
}

inline uint32_t narrow_from_f64(double value, const NarrowFormat& f) {
  const uint64_t bits = std::bit_cast<uint64_t>(value);
  const uint32_t sign = (bits & kF64SignBit) ? f.sign_bit : 0;
  const uint64_t magnitude = bits & ~kF64SignBit;
  if (magnitude > kF64Infinity) return sign | f.quiet_nan;
  if (magnitude >= f.overflow_from_f64) return sign | f.overflow_result;
  return sign | round_f64_magnitude(magnitude, f);
}

// F8_E8M0 from a positive finite value 2^e x 1.f: 2^e, or 2^(e+1) from 1.5 x 2^e up; NaN (0xFF)
// past 2^127. Below 2^-126 it follows ml_dtypes (0.5.1), which takes such a value through an
// F32 subnormal: 2^-127 and below give 2^-127 (code 0, as the format has no zero), anything
// between 2^-127 and 2^-126 rounds up to 2^-126. The callers send zero, negatives, infinities and
// NaNs to 0xFF.
inline uint8_t e8m0_from_power(int64_t unbiased_exponent, bool upper_half, bool fraction_nonzero) {
  if (unbiased_exponent < -127) return 0;
  if (unbiased_exponent == -127) return fraction_nonzero ? 1 : 0;
  const int64_t code = unbiased_exponent + 127 + (upper_half ? 1 : 0);
  return code >= 255 ? 0xff : static_cast<uint8_t>(code);
}

uint8_t f64_to_f8e8m0(double value) {
  const uint64_t bits = std::bit_cast<uint64_t>(value);
  if ((bits & kF64SignBit) != 0 || bits == 0 || bits >= kF64Infinity) return 0xff;
  const auto exponent = static_cast<int64_t>(bits >> 52);
  if (exponent == 0) return 0;  // an F64 subnormal, far below 2^-127
  const uint64_t fraction = bits & 0xfffffffffffffull;
  return e8m0_from_power(exponent - 1023, (fraction >> 51) != 0, fraction != 0);
}

// ---- Unaligned element access: tensors may sit at any byte offset in a mapped file. ----

template <typename T>
inline T load(const unsigned char* base, size_t i) {
  T v;
  std::memcpy(&v, base + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
inline void store(unsigned char* base, size_t i, T v) {
  std::memcpy(base + i * sizeof(T), &v, sizeof(T));
}

// Every F8 pattern decoded once: a load per element instead of the branches of the scalar
// functions (F8_E4M3 -> F32: 0.3 -> 2.9 G elements/s on the 2-core dev machine).
struct F8DecodeTables {
  float e4m3[256];
  float e5m2[256];
  float e8m0[256];
};

const F8DecodeTables& f8_decode_tables() {
  static const F8DecodeTables tables = [] {
    F8DecodeTables t;
    for (int bits = 0; bits < 256; ++bits) {
      t.e4m3[bits] = f8e4m3_to_f32(static_cast<uint8_t>(bits));
      t.e5m2[bits] = f8e5m2_to_f32(static_cast<uint8_t>(bits));
      t.e8m0[bits] = f8e8m0_to_f32(static_cast<uint8_t>(bits));
    }
    return t;
  }();
  return tables;
}

// Widens n elements of a float type other than F64 to F32 (exact).
void decode_to_f32(const unsigned char* in, DType from, unsigned char* out, size_t n) {
  switch (from) {
    case DType::F32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) store(out, i, bf16_to_f32(load<uint16_t>(in, i)));
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) store(out, i, f16_to_f32(load<uint16_t>(in, i)));
      return;
    case DType::F8_E4M3: {
      const float* table = f8_decode_tables().e4m3;
      for (size_t i = 0; i < n; ++i) store(out, i, table[in[i]]);
      return;
    }
    case DType::F8_E5M2: {
      const float* table = f8_decode_tables().e5m2;
      for (size_t i = 0; i < n; ++i) store(out, i, table[in[i]]);
      return;
    }
    case DType::F8_E8M0: {
      const float* table = f8_decode_tables().e8m0;
      for (size_t i = 0; i < n; ++i) store(out, i, table[in[i]]);
      return;
    }
    default:
      return;  // not reached: convert_elements dispatches F64 and non-floats elsewhere
  }
}

// Converts n F32 elements to any float type (one rounding, or exact for F64).
void encode_from_f32(const unsigned char* in, unsigned char* out, DType to, size_t n) {
  switch (to) {
    case DType::F32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) store(out, i, static_cast<double>(load<float>(in, i)));
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) store(out, i, f32_to_bf16(load<float>(in, i)));
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) store(out, i, f32_to_f16(load<float>(in, i)));
      return;
    case DType::F8_E4M3:
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_f8e4m3(load<float>(in, i));
      return;
    case DType::F8_E5M2:
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_f8e5m2(load<float>(in, i));
      return;
    case DType::F8_E8M0:
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_f8e8m0(load<float>(in, i));
      return;
    default:
      return;  // not reached
  }
}

// Converts n F64 elements to any float type other than F64, rounding once.
void encode_from_f64(const unsigned char* in, unsigned char* out, DType to, size_t n) {
  switch (to) {
    case DType::F32:  // the hardware conversion rounds to nearest even once
      for (size_t i = 0; i < n; ++i) store(out, i, static_cast<float>(load<double>(in, i)));
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        store(out, i, static_cast<uint16_t>(narrow_from_f64(load<double>(in, i), kBF16)));
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        store(out, i, static_cast<uint16_t>(narrow_from_f64(load<double>(in, i), kF16)));
      }
      return;
    case DType::F8_E4M3:
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<uint8_t>(narrow_from_f64(load<double>(in, i), kF8E4M3));
      }
      return;
    case DType::F8_E5M2:
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<uint8_t>(narrow_from_f64(load<double>(in, i), kF8E5M2));
      }
      return;
    case DType::F8_E8M0:
      for (size_t i = 0; i < n; ++i) out[i] = f64_to_f8e8m0(load<double>(in, i));
      return;
    default:
      return;  // not reached
  }
}

// Elements per stack chunk when converting between two types that are both not F32 or F64
// (e.g. BF16 -> F8_E4M3): 4 KiB of F32 stays in L1.
constexpr size_t kChunkElements = 1024;

}  // namespace

// ---- Scalar conversions ----

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t fraction = bits & 0x3ffu;
  if (exponent == 0x1f) {  // infinity, or NaN with its payload kept
    return std::bit_cast<float>(sign | kF32Infinity | (fraction << 13));
  }
  if (exponent == 0) {  // zero or subnormal: fraction * 2^-24, exact in F32
    const float magnitude = static_cast<float>(fraction) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (fraction << 13));
}

uint16_t f32_to_f16(float value) { return static_cast<uint16_t>(narrow_from_f32(value, kF16)); }

float f8e4m3_to_f32(uint8_t bits) {
  const uint32_t sign = uint32_t{bits & 0x80u} << 24;
  const uint32_t exponent = (bits >> 3) & 0xf;
  const uint32_t fraction = bits & 0x7u;
  if ((bits & 0x7f) == 0x7f) return std::bit_cast<float>(sign | kF32QuietNaN);
  if (exponent == 0) {  // zero or subnormal: fraction * 2^-9
    const float magnitude = static_cast<float>(fraction) * 0x1p-9f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 7) << 23) | (fraction << 20));
}

uint8_t f32_to_f8e4m3(float value) { return static_cast<uint8_t>(narrow_from_f32(value, kF8E4M3)); }

float f8e5m2_to_f32(uint8_t bits) {
  // F8_E5M2 is F16 without its low 8 bits, except that ml_dtypes returns the canonical quiet
  // NaN rather than keeping the payload.
  if ((bits & 0x7f) > 0x7c)
    return std::bit_cast<float>((uint32_t{bits & 0x80u} << 24) | kF32QuietNaN);
  return f16_to_f32(static_cast<uint16_t>(bits << 8));
}

uint8_t f32_to_f8e5m2(float value) { return static_cast<uint8_t>(narrow_from_f32(value, kF8E5M2)); }

float f8e8m0_to_f32(uint8_t bits) {
  if (bits == 0xff) return std::bit_cast<float>(kF32QuietNaN);
  if (bits == 0) return 0x1p-127f;  // an F32 subnormal
  return std::bit_cast<float>(uint32_t{bits} << 23);
}

uint8_t f32_to_f8e8m0(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & kF32SignBit) != 0 || bits == 0 || bits >= kF32Infinity) return 0xff;
  const uint32_t exponent = bits >> 23;
  if (exponent == 0) return bits > 0x400000 ? 1 : 0;  // an F32 subnormal: above 2^-127 goes up
  return e8m0_from_power(int64_t{exponent} - 127, (bits & 0x400000) != 0, false);
}

// ---- Arrays ----

void convert_elements(const void* src, DType from, void* dst, DType to, size_t n) {
  if (!is_float(from) || !is_float(to)) {
    const DType bad = is_float(from) ? to : from;
    throw Error(
        ErrorCode::UnsupportedConversion,
        "converting elements from " + std::string(dtype_name(from)) + " to " +
            std::string(dtype_name(to)) + ": " + std::string(dtype_name(bad)) +
            " is not a float type; expected F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0 or F64");
  }
  if (n == 0) return;
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  if (from == to) {
    std::memcpy(out, in, n * dtype_size(from));
  } else if (from == DType::F64) {
    encode_from_f64(in, out, to, n);
  } else if (to == DType::F32) {
    decode_to_f32(in, from, out, n);
  } else if (from == DType::F32) {
    encode_from_f32(in, out, to, n);
  } else {
    // Neither side is F32: widen a chunk to F32 (exact), then convert it, so there is still
    // only one rounding.
    const size_t in_size = dtype_size(from);
    const size_t out_size = dtype_size(to);
    float chunk[kChunkElements];
    auto* chunk_bytes = reinterpret_cast<unsigned char*>(chunk);
    for (size_t done = 0; done < n;) {
      const size_t count = std::min(kChunkElements, n - done);
      decode_to_f32(in + done * in_size, from, chunk_bytes, count);
      encode_from_f32(chunk_bytes, out + done * out_size, to, count);
      done += count;
    }
  }
}

}  // namespace grouplin
