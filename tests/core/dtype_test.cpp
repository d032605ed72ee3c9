// Element types and conversions. The conversions are compared bit for bit with tables that
// tests/core/dtype_reference.py computes with numpy and ml_dtypes (see that file for how each
// reference value is obtained); a few hand-picked cases below need no Python.

#include "grouplin/dtype.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "grouplin/error.hpp"

namespace grouplin {
namespace {

static_assert(std::endian::native == std::endian::little, "the reference files are little-endian");

using Bytes = std::vector<unsigned char>;

constexpr DType kFloatTypes[] = {DType::F32,     DType::F16,     DType::BF16, DType::F8_E4M3,
                                 DType::F8_E5M2, DType::F8_E8M0, DType::F64};
constexpr DType kNarrowTypes[] = {DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                                  DType::F8_E8M0};

// The reference tables, produced once per process by running the Python script.
struct ReferenceTables {
  bool ok = false;
  std::string failure;  // the script's output, or what went wrong reading its files
  std::map<std::string, Bytes> files;

  const Bytes& get(const std::string& name) const {
    static const Bytes kEmpty;
    auto it = files.find(name);
    return it == files.end() ? kEmpty : it->second;
  }
  const Bytes& src(DType t) const { return get("src_" + std::string(dtype_name(t)) + ".bin"); }
  const Bytes& ref(DType from, DType to) const {
    if (from == to) return src(from);
    return get("ref_" + std::string(dtype_name(from)) + "_" + std::string(dtype_name(to)) + ".bin");
  }
};

ReferenceTables run_reference_script() {
  ReferenceTables tables;
  std::string dir = (std::filesystem::temp_directory_path() / "grouplin_dtype_XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    tables.failure = "creating a temporary directory from " + dir + " failed";
    return tables;
  }
  const std::string command = std::string("'") + GROUPLIN_PYTHON + "' '" + GROUPLIN_SOURCE_DIR +
                              "/tests/core/dtype_reference.py' '" + dir + "' 2>&1";
  std::string output;
  int status = -1;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t got;
    while ((got = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
    status = pclose(pipe);
  }
  if (status != 0) {
    tables.failure = "running " + command + " failed (status " + std::to_string(status) +
                     "), output:\n" + output;
  } else {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      tables.files[entry.path().filename().string()] =
          Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    tables.ok = true;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return tables;
}

const ReferenceTables& reference() {
  static const ReferenceTables tables = run_reference_script();
  return tables;
}

uint64_t element(const Bytes& data, size_t size, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, data.data() + i * size, size);  // little-endian: low bytes first
  return v;
}

std::string hex(uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llX", static_cast<unsigned long long>(v));
  return text;
}

// Compares actual with expected element by element; reports the count and the first mismatches.
void expect_same_bits(const std::string& what, DType from, const Bytes& src, DType to,
                      const Bytes& expected, const Bytes& actual) {
  const size_t in_size = dtype_size(from);
  const size_t out_size = dtype_size(to);
  ASSERT_FALSE(src.empty()) << what << ": reference source missing";
  ASSERT_EQ(expected.size() / out_size, src.size() / in_size) << what << ": reference size";
  ASSERT_EQ(actual.size(), expected.size()) << what;
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < src.size() / in_size; ++i) {
    const uint64_t want = element(expected, out_size, i);
    const uint64_t got = element(actual, out_size, i);
    if (want == got) continue;
    if (++mismatches <= 10) {
      first += "\n  " + std::string(dtype_name(from)) + " " + hex(element(src, in_size, i)) +
               " -> " + std::string(dtype_name(to)) + " " + hex(got) + ", expected " + hex(want);
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": " << mismatches << " of " << src.size() / in_size
                            << " differ; first:" << first;
}

#define GROUPLIN_REQUIRE_REFERENCE()        \
  const ReferenceTables& ref = reference(); \
  ASSERT_TRUE(ref.ok) << ref.failure

// Applies one of the scalar functions to every element of src.
Bytes decode_with_scalar_function(DType from, const Bytes& src) {
  Bytes out(src.size() / dtype_size(from) * sizeof(float));
  for (size_t i = 0; i < src.size() / dtype_size(from); ++i) {
    const uint64_t bits = element(src, dtype_size(from), i);
    float v = 0;
    switch (from) {
      case DType::BF16:
        v = bf16_to_f32(static_cast<uint16_t>(bits));
        break;
      case DType::F16:
        v = f16_to_f32(static_cast<uint16_t>(bits));
        break;
      case DType::F8_E4M3:
        v = f8e4m3_to_f32(static_cast<uint8_t>(bits));
        break;
      case DType::F8_E5M2:
        v = f8e5m2_to_f32(static_cast<uint8_t>(bits));
        break;
      case DType::F8_E8M0:
        v = f8e8m0_to_f32(static_cast<uint8_t>(bits));
        break;
      default:
        ADD_FAILURE() << "not a narrow type";
        break;
    }
    std::memcpy(out.data() + i * sizeof(float), &v, sizeof(float));
  }
  return out;
}

Bytes encode_with_scalar_function(const Bytes& src, DType to) {
  const size_t n = src.size() / sizeof(float);
  Bytes out(n * dtype_size(to));
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src.data() + i * sizeof(float), sizeof(float));
    uint16_t bits = 0;
    switch (to) {
      case DType::BF16:
        bits = f32_to_bf16(v);
        break;
      case DType::F16:
        bits = f32_to_f16(v);
        break;
      case DType::F8_E4M3:
        bits = f32_to_f8e4m3(v);
        break;
      case DType::F8_E5M2:
        bits = f32_to_f8e5m2(v);
        break;
      case DType::F8_E8M0:
        bits = f32_to_f8e8m0(v);
        break;
      default:
        ADD_FAILURE() << "not a narrow type";
        break;
    }
    std::memcpy(out.data() + i * dtype_size(to), &bits, dtype_size(to));
  }
  return out;
}

Bytes convert_all(const Bytes& src, DType from, DType to) {
  const size_t n = src.size() / dtype_size(from);
  Bytes out(n * dtype_size(to));
  convert_elements(src.data(), from, out.data(), to, n);
  return out;
}

// ---- Checks against the reference tables ----

TEST(DTypeReferenceTest, EveryNarrowPatternDecodesLikeMlDtypes) {
  GROUPLIN_REQUIRE_REFERENCE();
  for (DType from : kNarrowTypes) {
    const Bytes& src = ref.src(from);
    expect_same_bits("scalar decode", from, src, DType::F32, ref.ref(from, DType::F32),
                     decode_with_scalar_function(from, src));
  }
}

TEST(DTypeReferenceTest, F32EncodesLikeMlDtypes) {
  GROUPLIN_REQUIRE_REFERENCE();
  const Bytes& src = ref.src(DType::F32);
  for (DType to : kNarrowTypes) {
    expect_same_bits("scalar encode", DType::F32, src, to, ref.ref(DType::F32, to),
                     encode_with_scalar_function(src, to));
  }
}

// F64 sources include ties nudged by less than an F32 ulp, where rounding by way of F32 would be
// wrong; the reference rounds once (see dtype_reference.py).
TEST(DTypeReferenceTest, F64RoundsOnceToEveryFloatType) {
  GROUPLIN_REQUIRE_REFERENCE();
  const Bytes& src = ref.src(DType::F64);
  for (DType to : kFloatTypes) {
    expect_same_bits("convert_elements", DType::F64, src, to, ref.ref(DType::F64, to),
                     convert_all(src, DType::F64, to));
  }
}

TEST(DTypeReferenceTest, ConvertElementsMatchesForEveryOtherFloatPair) {
  GROUPLIN_REQUIRE_REFERENCE();
  for (DType from : kFloatTypes) {
    if (from == DType::F64) continue;  // F64RoundsOnceToEveryFloatType
    for (DType to : kFloatTypes) {
      const Bytes& src = ref.src(from);
      expect_same_bits("convert_elements", from, src, to, ref.ref(from, to),
                       convert_all(src, from, to));
    }
  }
}

// ---- Hand-picked conversions (no Python needed) ----

TEST(DTypeConvertTest, F8E4M3SaturatesToMaxUpToTheTieThenGivesNaN) {
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(463.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7E);  // tie between 448 and 480 (NaN pattern): even
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(464.0f, 1000.0f)), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(-465.0f), 0xFF);
  EXPECT_EQ(f32_to_f8e4m3(INFINITY), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xFF);
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f), 0x00);                        // tie to 0
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);  // 2^-9
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0x1p-9f);
}

// MX scales: powers of two with no sign and no zero; what they cannot hold is NaN (0xFF).
TEST(DTypeConvertTest, F8E8M0IsTwoToTheCodeMinus127) {
  for (int code = 1; code < 255; ++code) {
    EXPECT_EQ(f8e8m0_to_f32(static_cast<uint8_t>(code)), std::ldexp(1.0f, code - 127)) << code;
  }
  EXPECT_EQ(f8e8m0_to_f32(0), 0x1p-127f);  // F32 subnormal
  EXPECT_TRUE(std::isnan(f8e8m0_to_f32(0xFF)));
  EXPECT_EQ(f32_to_f8e8m0(1.0f), 127);
  EXPECT_EQ(f32_to_f8e8m0(std::nextafter(1.5f, 0.0f)), 127);
  EXPECT_EQ(f32_to_f8e8m0(1.5f), 128);     // the midpoint goes up
  EXPECT_EQ(f32_to_f8e8m0(0x1p-149f), 0);  // nothing is below 2^-127
  EXPECT_EQ(f32_to_f8e8m0(0x1p-127f), 0);
  EXPECT_EQ(f32_to_f8e8m0(std::nextafter(0x1p-127f, 1.0f)), 1);  // ml_dtypes: up from here
  EXPECT_EQ(f32_to_f8e8m0(0x1p127f), 254);
  EXPECT_EQ(f32_to_f8e8m0(0x1.8p127f), 0xFF);
  for (float v : {0.0f, -0.0f, -1.0f, INFINITY, NAN}) EXPECT_EQ(f32_to_f8e8m0(v), 0xFF) << v;
}

TEST(DTypeConvertTest, IeeeFormatsOverflowToInfinityAndKeepSignedZero) {
  EXPECT_EQ(f32_to_bf16(0x1.fep127f), 0x7F7F);  // max
  EXPECT_EQ(f32_to_bf16(std::nextafter(0x1.ffp127f, 0.0f)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16(0x1.ffp127f), 0x7F80);  // max plus half an ulp: ties to even, inf
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f8e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7C);
  EXPECT_EQ(f32_to_f8e5m2(-0.0f), 0x80);
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
}

TEST(DTypeConvertTest, NaNBecomesCanonicalQuietNaNWithItsSign) {
  const float signalling = std::bit_cast<float>(0xFF800001u);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // not rounded into inf
  EXPECT_EQ(f32_to_bf16(signalling), 0xFFC0);
  EXPECT_EQ(f32_to_f16(signalling), 0xFE00);
  EXPECT_EQ(f32_to_f8e4m3(signalling), 0xFF);
  EXPECT_EQ(f32_to_f8e5m2(signalling), 0xFE);
}

// Pins down double rounding: 1 + 2^-8 + 2^-30 is just above the BF16 tie 1 + 2^-8, but rounds
// to that tie in F32, and the tie then goes to even, 1.0.
TEST(DTypeConvertTest, F64NarrowsWithoutRoundingThroughF32) {
  const double values[] = {1 + 0x1p-8 + 0x1p-30, 1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-4 + 0x1p-40,
                           1 + 0x1p-3 + 0x1p-40};
  uint16_t bf16 = 0;
  uint16_t f16 = 0;
  uint8_t e4m3 = 0;
  uint8_t e5m2 = 0;
  convert_elements(&values[0], DType::F64, &bf16, DType::BF16, 1);
  convert_elements(&values[1], DType::F64, &f16, DType::F16, 1);
  convert_elements(&values[2], DType::F64, &e4m3, DType::F8_E4M3, 1);
  convert_elements(&values[3], DType::F64, &e5m2, DType::F8_E5M2, 1);
  EXPECT_EQ(bf16, 0x3F81);
  EXPECT_EQ(f16, 0x3C01);
  EXPECT_EQ(e4m3, 0x39);
  EXPECT_EQ(e5m2, 0x3D);
}

TEST(DTypeConvertTest, ConvertElementsAcceptsUnalignedBuffers) {
  const float values[] = {1.0f, -2.5f, 0x1p-140f, 3.0e38f, -0.0f};
  unsigned char in[1 + sizeof values];
  unsigned char out[1 + 5 * sizeof(double)];
  std::memcpy(in + 1, values, sizeof values);
  convert_elements(in + 1, DType::F32, out + 1, DType::BF16, 5);
  for (size_t i = 0; i < 5; ++i) {
    uint16_t got;
    std::memcpy(&got, out + 1 + 2 * i, 2);
    EXPECT_EQ(got, f32_to_bf16(values[i])) << i;
  }
  convert_elements(in + 1, DType::F32, out + 1, DType::F64, 5);
  for (size_t i = 0; i < 5; ++i) {
    double got;
    std::memcpy(&got, out + 1 + 8 * i, 8);
    EXPECT_EQ(std::bit_cast<uint64_t>(got), std::bit_cast<uint64_t>(double{values[i]})) << i;
  }
}

TEST(DTypeConvertTest, ZeroElementsTouchesNothing) {
  convert_elements(nullptr, DType::F32, nullptr, DType::BF16, 0);
  convert_elements(nullptr, DType::F16, nullptr, DType::F16, 0);
}

TEST(DTypeConvertTest, NonFloatTypeThrowsUnsupportedConversion) {
  for (DType other : kAllDTypes) {
    if (is_float(other)) continue;
    for (bool other_is_source : {true, false}) {
      const DType from = other_is_source ? other : DType::F32;
      const DType to = other_is_source ? DType::BF16 : other;
      int32_t in[2] = {};
      int64_t out[2] = {};
      try {
        convert_elements(in, from, out, to, 1);
        ADD_FAILURE() << dtype_name(from) << " -> " << dtype_name(to) << " did not throw";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::UnsupportedConversion);
        EXPECT_NE(e.message().find(dtype_name(from)), std::string::npos) << e.what();
        EXPECT_NE(e.message().find(dtype_name(to)), std::string::npos) << e.what();
      }
    }
  }
}

// ---- Sizes and names ----

TEST(DTypeTest, SizeOfEveryType) {
  const std::map<DType, size_t> expected = {
      {DType::F32, 4},     {DType::F16, 2},     {DType::BF16, 2}, {DType::F8_E4M3, 1},
      {DType::F8_E5M2, 1}, {DType::F8_E8M0, 1}, {DType::F64, 8},  {DType::BOOL, 1},
      {DType::U8, 1},      {DType::I8, 1},      {DType::I16, 2},  {DType::U16, 2},
      {DType::I32, 4},     {DType::U32, 4},     {DType::I64, 8},  {DType::U64, 8},
  };
  ASSERT_EQ(expected.size(), std::size(kAllDTypes));
  for (DType t : kAllDTypes) EXPECT_EQ(dtype_size(t), expected.at(t)) << dtype_name(t);
}

TEST(DTypeTest, NamesAreSafetensorsSpellingsAndRoundTrip) {
  const char* expected[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F64", "BOOL",
                            "U8",  "I8",  "I16",  "U16",     "I32",     "U32",     "I64", "U64"};
  ASSERT_EQ(std::size(expected), std::size(kAllDTypes));
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    EXPECT_EQ(dtype_name(kAllDTypes[i]), expected[i]);
    EXPECT_EQ(dtype_from_name(expected[i]), kAllDTypes[i]) << expected[i];
  }
}

TEST(DTypeTest, UnknownNamesAreRejected) {
  for (const char* name :
       {"", "f32", "FP32", "F8_E4M3FN", "BFLOAT16", "F32 ", " F32", "I4", "U", "F8", "float32"}) {
    EXPECT_EQ(dtype_from_name(name), std::nullopt) << '"' << name << '"';
  }
}

TEST(DTypeTest, IsFloatOnlyForFloatTypes) {
  for (DType t : kAllDTypes) {
    const bool expected =
        std::find(std::begin(kFloatTypes), std::end(kFloatTypes), t) != std::end(kFloatTypes);
    EXPECT_EQ(is_float(t), expected) << dtype_name(t);
  }
}

}  // namespace
}  // namespace grouplin
