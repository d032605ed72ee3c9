// One test per named check of the safetensors reader, each on a tiny hand-made file, plus a
// table that walks the whole ErrorCode list.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"
#include "hostile_text.hpp"
#include "io/error_code_groups.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

// The 8-byte little-endian length, then the header, then the data.
std::string st_file(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

std::string with_length(uint64_t n, const std::string& rest) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + rest;
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

std::shared_ptr<Storage> to_storage(const std::string& bytes) {
  auto s = Storage::allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(s->mutable_data(), bytes.data(), bytes.size());
  return s;
}

SafetensorsFile parse(const std::string& bytes) {
  return parse_safetensors(to_storage(bytes), "ckpt.safetensors");
}

// The error parsing `bytes` throws, or nullopt.
std::optional<Error> parse_error(const std::string& bytes) {
  try {
    parse(bytes);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

#define EXPECT_LOAD_ERROR(bytes, expected_code, needle)                                           \
  do {                                                                                            \
    std::optional<Error> err_ = parse_error(bytes);                                               \
    ASSERT_TRUE(err_.has_value()) << "no error";                                                  \
    EXPECT_EQ(err_->code(), ErrorCode::expected_code) << err_->what();                            \
    EXPECT_EQ(err_->message().rfind("loading \"ckpt.safetensors\": ", 0), 0u) << err_->message(); \
    EXPECT_NE(err_->message().find(needle), std::string::npos) << err_->message();                \
  } while (0)

const std::string kF32x2 = std::string("\0\0\x80\x3f\0\0\0\x40", 8);  // 1.0f, 2.0f

// ---- size, caps, bounds ----

TEST(SafetensorsReader, FileTooSmall) {
  EXPECT_LOAD_ERROR("", FileTooSmall, "the file has 0 bytes");
  EXPECT_LOAD_ERROR(std::string(7, '\0'), FileTooSmall, "the file has 7 bytes, fewer than the 8");
}

TEST(SafetensorsReader, HeaderTooLarge) {
  EXPECT_LOAD_ERROR(with_length(100'000'001, "{}"), HeaderTooLarge,
                    "the header length 100000001 exceeds the limit of 100000000 bytes");
  // The cap comes before the bounds check, and 8 + N cannot overflow.
  EXPECT_LOAD_ERROR(with_length(UINT64_MAX, ""), HeaderTooLarge, "18446744073709551615");
}

TEST(SafetensorsReader, HeaderPastEnd) {
  EXPECT_LOAD_ERROR(with_length(100'000'000, "{}"), HeaderPastEnd,
                    "the header length 100000000 runs past the end of the file (2 bytes follow");
  EXPECT_LOAD_ERROR(with_length(3, "{}"), HeaderPastEnd, "header length 3");
}

// ---- parse ----

TEST(SafetensorsReader, HeaderNotUtf8) {
  EXPECT_LOAD_ERROR(st_file("{\"\xff\":1}"), InvalidHeader, "not valid UTF-8 (byte 2 of");
  EXPECT_LOAD_ERROR(st_file("{\"\xc0\xaf\":1}"), InvalidHeader, "not valid UTF-8");  // overlong
  EXPECT_LOAD_ERROR(st_file("{\"\xed\xa0\x80\":1}"), InvalidHeader, "UTF-8");        // surrogate
  EXPECT_LOAD_ERROR(st_file("{\"\xf4\x90\x80\x80\":1}"), InvalidHeader, "UTF-8");    // > U+10FFFF
  EXPECT_LOAD_ERROR(st_file("{\"\xe2\x82\":1}"), InvalidHeader, "UTF-8");            // cut short
}

TEST(SafetensorsReader, HeaderNotJson) {
  EXPECT_LOAD_ERROR(st_file(""), InvalidHeader, "not valid JSON");
  EXPECT_LOAD_ERROR(st_file("{\"a\":"), InvalidHeader, "not valid JSON");
  EXPECT_LOAD_ERROR(st_file("{} x"), InvalidHeader, "not valid JSON");
  EXPECT_LOAD_ERROR(st_file("{/*c*/}"), InvalidHeader, "not valid JSON");
  EXPECT_LOAD_ERROR(st_file("{\"\\ud800\":1}"), InvalidHeader, "not valid JSON");  // lone surrogate
}

// Regression: the header's syntax error quoted nlohmann's message as it was, whose "last read"
// token carried DEL, C1 controls and direction overrides raw to the terminal.
TEST(SafetensorsReader, ParserTextInMessagesIsEscaped) {
  for (const test_text::HostileControl& c : test_text::kHostileControls) {
    SCOPED_TRACE(c.escaped);
    std::optional<Error> e = parse_error(st_file("{\"x" + c.raw + "\x01\":1}"));
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::InvalidHeader) << e->what();
    EXPECT_NE(e->message().find("not valid JSON"), std::string::npos) << e->message();
    test_text::expect_escaped(e->message(), c);
  }
}

// Regression: nlohmann's lexer takes a NUL byte for the end of the input and skips a leading
// byte-order mark, so "{}\0garbage" and BOM + "{}" were accepted; JSON and the reference refuse
// both.
TEST(SafetensorsReader, NulByteOrByteOrderMarkIsNotJson) {
  EXPECT_LOAD_ERROR(st_file(std::string("{}\0", 3)), InvalidHeader, "a NUL byte at byte 2");
  EXPECT_LOAD_ERROR(st_file(std::string("{}\0garbage", 10)), InvalidHeader, "NUL byte");
  EXPECT_LOAD_ERROR(st_file("\xef\xbb\xbf{}"), InvalidHeader, "byte-order mark");
}

// A syntax error anywhere wins over a structural problem met before it (parse → structure).
TEST(SafetensorsReader, SyntaxErrorWinsOverEarlierStructuralProblem) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "F33", "[1]", "[0,1]") + ",}"),
                    InvalidHeader, "not valid JSON");
}

// nlohmann's SAX parser is iterative: nesting a million levels deep cannot overflow the stack.
TEST(SafetensorsReader, DeepNestingIsRejectedWithoutRecursion) {
  const size_t kDepth = 1'000'000;
  std::string open(kDepth, '[');
  EXPECT_LOAD_ERROR(st_file("{\"t\":" + open + std::string(kDepth, ']') + "}"), InvalidHeader,
                    "tensor \"t\": the entry is an array, not an object");
  EXPECT_LOAD_ERROR(st_file(open), InvalidHeader, "not valid JSON");
  std::string objects;
  for (int i = 0; i < 200'000; ++i) objects += "{\"a\":";
  EXPECT_LOAD_ERROR(st_file(objects), InvalidHeader, "not valid JSON");
}

// ---- structure ----

TEST(SafetensorsReader, HeaderNotAnObject) {
  EXPECT_LOAD_ERROR(st_file("[]"), InvalidHeader, "the header is an array, not a JSON object");
  EXPECT_LOAD_ERROR(st_file("\"x\""), InvalidHeader, "the header is a string, not a JSON object");
  EXPECT_LOAD_ERROR(st_file("7"), InvalidHeader, "not a JSON object");
  EXPECT_LOAD_ERROR(st_file("null"), InvalidHeader, "not a JSON object");
}

TEST(SafetensorsReader, EntryNotAnObject) {
  EXPECT_LOAD_ERROR(st_file("{\"t\":[0,4]}"), InvalidHeader,
                    "tensor \"t\": the entry is an array, not an object");
  EXPECT_LOAD_ERROR(st_file("{\"t\":\"F32\"}"), InvalidHeader, "the entry is a string");
  EXPECT_LOAD_ERROR(st_file("{\"t\":null}"), InvalidHeader, "the entry is null");
}

TEST(SafetensorsReader, UnknownFieldIsRejected) {
  EXPECT_LOAD_ERROR(
      st_file("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"strides\":[1]}}",
              "a"),
      InvalidHeader,
      "tensor \"t\": unknown field \"strides\" (allowed: dtype, shape, data_offsets)");
}

TEST(SafetensorsReader, MissingField) {
  EXPECT_LOAD_ERROR(st_file("{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "a"), InvalidHeader,
                    "tensor \"t\": missing field \"dtype\"");
  EXPECT_LOAD_ERROR(st_file("{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", "a"),
                    InvalidHeader, "missing field \"shape\"");
  EXPECT_LOAD_ERROR(st_file("{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", "a"), InvalidHeader,
                    "missing field \"data_offsets\"");
}

TEST(SafetensorsReader, DTypeNotAString) {
  EXPECT_LOAD_ERROR(st_file("{\"t\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", "a"),
                    InvalidHeader, "tensor \"t\": dtype is the number 5, not a string");
}

TEST(SafetensorsReader, ShapeNotAnArrayOfNonNegativeIntegers) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "3", "[0,3]") + "}", "abc"),
                    InvalidHeader, "tensor \"t\": shape is the number 3, not an array of integers");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "[-1]", "[0,0]") + "}"),
                    InvalidHeader, "shape holds the negative number -1");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "[-0]", "[0,0]") + "}"),
                    InvalidHeader, "negative number 0");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "[1.0]", "[0,1]") + "}", "a"),
                    InvalidHeader, "shape holds the number 1.0 (not an integer");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "[[1]]", "[0,1]") + "}", "a"),
                    InvalidHeader, "shape holds an array");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "[\"1\"]", "[0,1]") + "}", "a"),
                    InvalidHeader, "shape holds a string");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "U8", "[1e0]", "[0,1]") + "}", "a"),
                    InvalidHeader, "not an integer");
}

TEST(SafetensorsReader, DuplicateNames) {
  std::string e = entry("t", "U8", "[1]", "[0,1]");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + e + "," + e + "}", "a"), DuplicateName,
                    "the header has two entries named \"t\"");
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}"), DuplicateName,
                    "\"__metadata__\" has two entries named \"k\"");
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":{},\"__metadata__\":{}}"), DuplicateName,
                    "two entries named \"__metadata__\"");
  EXPECT_LOAD_ERROR(
      st_file("{\"t\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
              "a"),
      DuplicateName, "tensor \"t\": field \"dtype\" appears twice");
}

TEST(SafetensorsReader, InvalidMetadata) {
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":[]}"), InvalidMetadata,
                    "\"__metadata__\" is an array, not an object of strings");
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":\"x\"}"), InvalidMetadata, "is a string");
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":{\"k\":1}}"), InvalidMetadata,
                    "\"__metadata__\" entry \"k\" is the number 1, not a string");
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":{\"k\":{\"a\":\"b\"}}}"), InvalidMetadata,
                    "entry \"k\" is an object");
  EXPECT_LOAD_ERROR(st_file("{\"__metadata__\":{\"k\":null}}"), InvalidMetadata, "is null");
}

TEST(SafetensorsReader, NullMetadataMeansNone) {
  SafetensorsFile f = parse(st_file("{\"__metadata__\":null}"));
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_TRUE(f.tensors.empty());
}

TEST(SafetensorsReader, UnknownDType) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "F33", "[1]", "[0,4]") + "}", "abcd"),
                    UnknownDType, "tensor \"t\": unknown dtype \"F33\"");
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "f32", "[1]", "[0,4]") + "}", "abcd"),
                    UnknownDType, "\"f32\"");
}

TEST(SafetensorsReader, DTypeGroupLinDoesNotHave) {
  for (const char* name : {"C64", "F4", "F6_E2M3", "F6_E3M2"}) {
    EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", name, "[1]", "[0,1]") + "}", "a"),
                      UnsupportedDType,
                      "dtype \"" + std::string(name) + "\" is valid safetensors but GroupLin");
  }
}

TEST(SafetensorsReader, InvalidOffsets) {
  auto bad = [](const std::string& offsets) {
    return st_file(std::string("{") + entry("t", "U8", "[1]", offsets) + "}", "a");
  };
  EXPECT_LOAD_ERROR(bad("[1]"), InvalidOffsets, "data_offsets has 1 numbers, expected 2");
  EXPECT_LOAD_ERROR(bad("[]"), InvalidOffsets, "has 0 numbers");
  EXPECT_LOAD_ERROR(bad("[0,1,2]"), InvalidOffsets, "more than 2 numbers");
  EXPECT_LOAD_ERROR(bad("[-1,0]"), InvalidOffsets, "data_offsets holds the negative number -1");
  EXPECT_LOAD_ERROR(bad("[0,1.5]"), InvalidOffsets, "holds the number 1.5");
  EXPECT_LOAD_ERROR(bad("[0,18446744073709551616]"), InvalidOffsets, "too large");
  EXPECT_LOAD_ERROR(bad("[\"0\",\"1\"]"), InvalidOffsets, "holds a string");
  EXPECT_LOAD_ERROR(bad("{\"begin\":0}"), InvalidOffsets,
                    "data_offsets is an object, not an array");
  EXPECT_LOAD_ERROR(bad("[1,0]"), InvalidOffsets, "tensor \"t\": offsets [1, 0] have begin > end");
}

TEST(SafetensorsReader, ShapeProductOverflows) {
  EXPECT_LOAD_ERROR(
      st_file(std::string("{") + entry("t", "U8", "[4294967296,4294967296]", "[0,0]") + "}"),
      SizeOverflow, "U8 [4294967296, 4294967296] needs more than 2^63-1 bytes");
  // numel fits, bytes do not.
  EXPECT_LOAD_ERROR(
      st_file(std::string("{") + entry("t", "F64", "[2305843009213693952]", "[0,0]") + "}"),
      SizeOverflow, "needs more than 2^63-1 bytes");
  // A dimension that does not fit in int64, even when another is 0.
  EXPECT_LOAD_ERROR(
      st_file(std::string("{") + entry("t", "U8", "[0,9223372036854775808]", "[0,0]") + "}"),
      SizeOverflow, "has a dimension larger than 2^63-1");
}

TEST(SafetensorsReader, TensorSizeMismatch) {
  std::optional<Error> e = parse_error(
      st_file(std::string("{") + entry("fc1.weight3", "F32", "[2,2]", "[0,4]") + "}", "abcd"));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::TensorSizeMismatch);
  EXPECT_EQ(e->message(),
            "loading \"ckpt.safetensors\": tensor \"fc1.weight3\": offsets [0, 4] but F32 [2, 2] "
            "needs 16 bytes");
}

TEST(SafetensorsReader, FirstStructuralProblemInHeaderOrderWins) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("a", "U8", "[2]", "[0,1]") + "," +
                                entry("b", "F33", "[1]", "[1,2]") + "}",
                            "ab"),
                    TensorSizeMismatch, "tensor \"a\"");
}

// ---- tiling ----

TEST(SafetensorsReader, GapBeforeFirstTensor) {
  EXPECT_LOAD_ERROR(
      st_file(std::string("{") + entry("t", "U8", "[1]", "[1,2]") + "}", "ab"),
      OffsetsNotContiguous,
      "tensor \"t\": offsets [1, 2] leave bytes [0, 1) of the data buffer to no tensor");
}

TEST(SafetensorsReader, GapBetweenTensors) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("b", "U8", "[1]", "[3,4]") + "," +
                                entry("a", "U8", "[2]", "[0,2]") + "}",
                            "abcd"),
                    OffsetsNotContiguous,
                    "tensor \"b\": offsets [3, 4] leave bytes [2, 3) to no tensor after tensor "
                    "\"a\" [0, 2]");
}

TEST(SafetensorsReader, OverlappingTensors) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("a", "U8", "[4]", "[0,4]") + "," +
                                entry("b", "U8", "[4]", "[2,6]") + "}",
                            "abcdef"),
                    OffsetsNotContiguous,
                    "tensor \"b\": offsets [2, 6] overlap tensor \"a\" [0, 4]");
  // A zero-size tensor inside another one overlaps it too.
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("a", "U8", "[4]", "[0,4]") + "," +
                                entry("z", "U8", "[0]", "[2,2]") + "}",
                            "abcd"),
                    OffsetsNotContiguous, "tensor \"z\": offsets [2, 2] overlap tensor \"a\"");
}

TEST(SafetensorsReader, AliasingTensors) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("a", "F32", "[2]", "[0,8]") + "," +
                                entry("b", "F32", "[2]", "[0,8]") + "}",
                            kF32x2),
                    OffsetsNotContiguous,
                    "tensor \"b\": offsets [0, 8] alias the bytes of tensor \"a\"");
}

// ---- exact end ----

TEST(SafetensorsReader, TruncatedData) {
  EXPECT_LOAD_ERROR(st_file(std::string("{") + entry("t", "F32", "[2]", "[0,8]") + "}", "abcd"),
                    Truncated, "the tensors end at byte 8 of the data buffer, which has 4 bytes");
}

TEST(SafetensorsReader, TrailingBytes) {
  EXPECT_LOAD_ERROR(
      st_file(std::string("{") + entry("t", "F32", "[2]", "[0,8]") + "}", kF32x2 + "xy"),
      TrailingBytes, "which has 10 bytes (2 trailing bytes)");
  EXPECT_LOAD_ERROR(st_file("{}", "x"), TrailingBytes, "the tensors end at byte 0");
}

// A huge tensor in a tiny file: rejected before anything is allocated from its numbers.
TEST(SafetensorsReader, NoAllocationFromFileNumbersBeforeValidation) {
  std::string bytes =
      st_file(std::string("{") + entry("t", "F32", "[1000000000]", "[0,4000000000]") + "}", "abcd");
  auto storage = to_storage(bytes);
  detail::StorageStats before = detail::storage_stats();
  EXPECT_THROW(parse_safetensors(storage, "x"), Error);
  EXPECT_EQ(detail::storage_stats().allocations, before.allocations);
}

// ---- what is legal ----

TEST(SafetensorsReader, EmptyFile) {
  SafetensorsFile f = parse(st_file("{}"));
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
  f = parse(st_file("{}      "));  // padding
  EXPECT_TRUE(f.tensors.empty());
  f = parse(st_file(" \n{}"));  // leading whitespace, as the reference accepts
  EXPECT_TRUE(f.tensors.empty());
}

TEST(SafetensorsReader, ZeroSizeAndZeroRankTensors) {
  std::string header =
      "{\"__metadata__\":{\"format\":\"pt\",\"\":\"\"}," + entry("scalar", "F32", "[]", "[0,4]") +
      "," + entry("empty", "F32", "[0]", "[4,4]") + "," +
      entry("empty2", "BF16", "[3,0,2]", "[4,4]") + "," + entry("last", "U8", "[2]", "[4,6]") +
      "," + entry("first_empty", "U8", "[0]", "[0,0]") + "}";
  SafetensorsFile f = parse(st_file(header, std::string("\0\0\x80\x3f", 4) + "xy"));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"", ""}}));
  // Ordered by offsets; ties keep header order.
  EXPECT_EQ(f.tensors.keys(),
            (std::vector<std::string>{"first_empty", "scalar", "empty", "empty2", "last"}));
  const Tensor& s = f.tensors.at("scalar");
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(*s.data_as<float>(), 1.0f);
  EXPECT_EQ(f.tensors.at("empty2").shape(), (Shape{3, 0, 2}));
  EXPECT_EQ(f.tensors.at("empty2").numel(), 0);
  EXPECT_EQ(std::memcmp(f.tensors.at("last").data(), "xy", 2), 0);
}

TEST(SafetensorsReader, NamesWithEscapesAndUnicode) {
  SafetensorsFile f =
      parse(st_file("{\"a\\\"b\\\\c\\n\\u0000\\u00e9\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],"
                    "\"data_offsets\":[0,1]}}",
                    "z"));
  EXPECT_EQ(f.tensors.keys(),
            (std::vector<std::string>{std::string("a\"b\\c\n\0\xc3\xa9\xc3\xa9", 11)}));
}

TEST(SafetensorsReader, ViewsShareTheBufferWithoutCopying) {
  std::string header = std::string("{") + entry("b", "F32", "[2]", "[0,8]") + "," +
                       entry("a", "U8", "[2]", "[8,10]") + "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes = st_file(header, kF32x2 + "xy");
  auto storage = to_storage(bytes);
  detail::StorageStats before = detail::storage_stats();
  SafetensorsFile f = parse_safetensors(storage, "x");
  EXPECT_EQ(detail::storage_stats().allocations, before.allocations);
  EXPECT_EQ(detail::storage_stats().copied_bytes, before.copied_bytes);
  const Tensor& b = f.tensors.at("b");
  EXPECT_EQ(b.storage(), storage);
  EXPECT_EQ(b.data(), storage->data() + 8 + header.size());
  EXPECT_EQ(b.data_as<float>()[1], 2.0f);
  EXPECT_EQ(f.tensors.at("a").data(), storage->data() + 8 + header.size() + 8);
}

// Data not aligned to the element size (a header length that is not a multiple of 8, as other
// writers may produce) is copied to aligned memory, so kernels can use typed pointers.
TEST(SafetensorsReader, MisalignedTensorIsCopiedToAlignedMemory) {
  std::string header = std::string("{") + entry("t", "F32", "[2]", "[0,8]") + "}";
  if (header.size() % 4 == 0) header += ' ';
  SafetensorsFile f = parse(st_file(header, kF32x2));
  const Tensor& t = f.tensors.at("t");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 4, 0u);
  EXPECT_EQ(t.data_as<float>()[0], 1.0f);
  EXPECT_EQ(t.data_as<float>()[1], 2.0f);
}

TEST(SafetensorsReader, LoadedTensorsAreReadOnlyViewsOfTheMapping) {
  std::string tmpl = (fs::temp_directory_path() / "grouplin_reader_XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  std::string path = tmpl + "/ckpt.safetensors";
  std::string header = std::string("{") + entry("w", "F32", "[2]", "[0,8]") + "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream(path, std::ios::binary) << st_file(header, kF32x2);

  detail::StorageStats before = detail::storage_stats();
  SafetensorsFile f = load_safetensors(path);
  fs::remove_all(tmpl);  // the mapping keeps the bytes
  EXPECT_EQ(detail::storage_stats().allocations, before.allocations);
  Tensor w = f.tensors.at("w");
  EXPECT_FALSE(w.writable());
  EXPECT_EQ(w.storage()->size(), 8 + header.size() + 8);  // the whole file
  EXPECT_EQ(w.data(), w.storage()->data() + 8 + header.size());
  EXPECT_EQ(w.data_as<float>()[1], 2.0f);
  try {
    w.mutable_data();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ReadOnlyTensor);
  }
}

TEST(SafetensorsReader, LoadNamesTheFileInErrors) {
  try {
    load_safetensors("/no/such/dir/x.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
    EXPECT_NE(e.message().find("\"/no/such/dir/x.safetensors\""), std::string::npos);
  }
}

TEST(SafetensorsReader, LongOrStrangeNamesAreQuotedSafelyInMessages) {
  std::string name(1000, 'n');
  std::optional<Error> e =
      parse_error(st_file(std::string("{") + entry(name, "F33", "[1]", "[0,1]") + "}", "a"));
  ASSERT_TRUE(e.has_value());
  EXPECT_LT(e->message().size(), 700u);
  EXPECT_NE(e->message().find("... (1000 bytes)"), std::string::npos) << e->message();
  e = parse_error(
      st_file("{\"a\\u0001\\n\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,1]}}", "a"));
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message().find("tensor \"a\\x01\\x0a\""), std::string::npos) << e->message();
}

// ---- the table: every ErrorCode is either produced by one of these inputs or listed as one the
// safetensors reader never throws. A new code in error.hpp fails this test until it is placed.

struct Case {
  ErrorCode code;
  std::string bytes;
};

std::vector<Case> malicious_inputs() {
  std::string u8 = entry("t", "U8", "[1]", "[0,1]");
  return {
      {ErrorCode::FileTooSmall, "abc"},
      {ErrorCode::HeaderTooLarge, with_length(100'000'001, "{}")},
      {ErrorCode::HeaderPastEnd, with_length(64, "{}")},
      {ErrorCode::InvalidHeader, st_file("{\"t\":{\"dtype\":\"U8\"")},
      {ErrorCode::InvalidMetadata, st_file("{\"__metadata__\":{\"k\":[]}}")},
      {ErrorCode::UnknownDType,
       st_file(std::string("{") + entry("t", "Q8", "[1]", "[0,1]") + "}", "a")},
      {ErrorCode::UnsupportedDType,
       st_file(std::string("{") + entry("t", "C64", "[1]", "[0,1]") + "}", "a")},
      {ErrorCode::DuplicateName, st_file(std::string("{") + u8 + "," + u8 + "}", "a")},
      {ErrorCode::InvalidOffsets,
       st_file(std::string("{") + entry("t", "U8", "[1]", "[1,0]") + "}", "a")},
      {ErrorCode::SizeOverflow,
       st_file(std::string("{") + entry("t", "U64", "[4294967296,4294967296]", "[0,0]") + "}")},
      {ErrorCode::TensorSizeMismatch,
       st_file(std::string("{") + entry("t", "U8", "[2]", "[0,1]") + "}", "a")},
      {ErrorCode::OffsetsNotContiguous,
       st_file(std::string("{") + u8 + "," + entry("u", "U8", "[1]", "[0,1]") + "}", "a")},
      {ErrorCode::Truncated, st_file(std::string("{") + u8 + "}")},
      {ErrorCode::TrailingBytes, st_file(std::string("{") + u8 + "}", "ab")},
  };
}

// Codes the safetensors reader never raises for file content: other layers, and the .pt format.
bool never_thrown_by_safetensors_reader(ErrorCode code) {
  if (test_io::raised_outside_file_parsing(code)) return true;
  switch (code) {
    case ErrorCode::UnknownFormat:
    case ErrorCode::InvalidZip:
    case ErrorCode::CompressedEntry:
    case ErrorCode::EncryptedEntry:
    case ErrorCode::ZipHeaderMismatch:
    case ErrorCode::CrcMismatch:
    case ErrorCode::MissingRecord:
    case ErrorCode::ForbiddenOpcode:
    case ErrorCode::ForbiddenGlobal:
    case ErrorCode::PickleStackError:
    case ErrorCode::PickleLimitExceeded:
    case ErrorCode::InvalidPickle:
    case ErrorCode::StorageTooSmall:
    case ErrorCode::StorageSizeMismatch:
      return true;
    default:
      return false;
  }
}

TEST(SafetensorsReader, EveryErrorCodeIsCoveredOrExcluded) {
  std::vector<Case> cases = malicious_inputs();
  std::vector<ErrorCode> all = {
#define GROUPLIN_LIST_ENTRY(name) ErrorCode::name,
      GROUPLIN_ERROR_CODES(GROUPLIN_LIST_ENTRY)
#undef GROUPLIN_LIST_ENTRY
  };
  for (ErrorCode code : all) {
    SCOPED_TRACE(std::string(error_code_name(code)));
    auto it =
        std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.code == code; });
    if (it == cases.end()) {
      EXPECT_TRUE(never_thrown_by_safetensors_reader(code))
          << "no malicious input for this code: add one to malicious_inputs()";
      continue;
    }
    EXPECT_FALSE(never_thrown_by_safetensors_reader(code));
    std::optional<Error> e = parse_error(it->bytes);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), code) << e->what();
  }
}

}  // namespace
}  // namespace grouplin
