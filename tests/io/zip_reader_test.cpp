// The zip layer of .pt files: one test per named check of ZipReader, built from archives that
// ZipWriter makes and then damaged at known offsets.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "io/formats/zip.hpp"
#include "io/memory_sink.hpp"

namespace grouplin::zip {
namespace {

using test_io::MemorySink;

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::vector<std::byte> make_archive(const std::vector<std::pair<std::string, std::string>>& records,
                                    ZipWriter::Options options = {}) {
  MemorySink sink;
  ZipWriter writer(sink, options);
  for (const auto& [name, data] : records) writer.add_record(name, as_bytes(data));
  writer.finish();
  return sink.bytes;
}

std::shared_ptr<Storage> to_storage(const std::vector<std::byte>& bytes) {
  auto s = Storage::allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(s->mutable_data(), bytes.data(), bytes.size());
  return s;
}

uint32_t get32(const std::vector<std::byte>& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | std::to_integer<uint32_t>(b[at + i]);
  return v;
}
void put16(std::vector<std::byte>& b, size_t at, uint16_t v) {
  b[at] = std::byte(v & 0xFF);
  b[at + 1] = std::byte(v >> 8);
}
void put32(std::vector<std::byte>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = std::byte((v >> (8 * i)) & 0xFF);
}

// Offset of the central directory, from the classic end record (the last 22 bytes).
size_t cd_offset(const std::vector<std::byte>& b) { return get32(b, b.size() - 22 + 16); }
// Offset of central entry i (names of equal length in these tests).
size_t cd_entry(const std::vector<std::byte>& b, size_t i, size_t name_len) {
  return cd_offset(b) + i * (46 + name_len);
}

// The archive without its ZIP64 end record and locator (the classic layout).
std::vector<std::byte> strip_zip64(const std::vector<std::byte>& b) {
  const size_t cd_end = cd_offset(b) + get32(b, b.size() - 22 + 12);
  std::vector<std::byte> out(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cd_end));
  out.insert(out.end(), b.end() - 22, b.end());
  return out;
}

void expect_error(const std::vector<std::byte>& bytes, ErrorCode code, const std::string& part) {
  try {
    ZipReader::open(to_storage(bytes));
    FAIL() << "expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(e.message().find(part), std::string::npos) << e.what();
  }
}

const std::vector<std::pair<std::string, std::string>> kRecords = {
    {"arc/data.pkl", "pickle bytes"},
    {"arc/data/0", std::string(100, 'x')},
    {"arc/version", "3\n"}};

TEST(Crc32, KnownValues) {
  EXPECT_EQ(crc32(0, as_bytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(crc32(0, {}), 0u);
  // Continuation equals one pass, across the 8-byte fast path.
  std::string long_text(1000, 'q');
  for (size_t i = 0; i < long_text.size(); ++i) long_text[i] = static_cast<char>(i * 7);
  uint32_t whole = crc32(0, as_bytes(long_text));
  uint32_t split =
      crc32(crc32(0, as_bytes(long_text).first(333)), as_bytes(long_text).subspan(333));
  EXPECT_EQ(whole, split);
}

TEST(ZipReader, ReadsWhatTheWriterWrites) {
  auto bytes = make_archive(kRecords);
  auto file = to_storage(bytes);
  ZipReader r = ZipReader::open(file);
  ASSERT_EQ(r.entries().size(), 3u);
  for (size_t i = 0; i < kRecords.size(); ++i) {
    const Entry& e = r.entries()[i];
    EXPECT_EQ(e.name, kRecords[i].first);
    EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    auto data = r.bytes(e);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()),
              kRecords[i].second);
    EXPECT_NO_THROW(r.check_crc(e));
  }
  // Zero-copy: the record storage points into the file bytes.
  const Entry* e = r.find("arc/data/0");
  ASSERT_NE(e, nullptr);
  auto s = r.storage(*e);
  EXPECT_EQ(s->data(), file->data() + e->data_offset);
  EXPECT_TRUE(s->writable());  // as the file's bytes are (a copy-on-write mapping's are)
  EXPECT_EQ(r.find("arc/missing"), nullptr);
  // Over read-only bytes (a read-only mapping), records are read-only.
  ZipReader ro = ZipReader::open(Storage::wrap(file->data(), file->size(), file));
  EXPECT_FALSE(ro.storage(*ro.find("arc/data/0"))->writable());
}

TEST(ZipReader, ReadsForcedZip64AndClassicLayouts) {
  auto zip64 = make_archive(kRecords, {.alignment = 64, .force_zip64 = true});
  ZipReader a = ZipReader::open(to_storage(zip64));
  ASSERT_EQ(a.entries().size(), 3u);
  EXPECT_EQ(a.entries()[1].size, 100u);
  EXPECT_EQ(a.entries()[1].data_offset % 64, 0u);
  ZipReader b = ZipReader::open(to_storage(strip_zip64(make_archive(kRecords))));
  EXPECT_EQ(b.entries().size(), 3u);
}

TEST(ZipReader, EmptyArchive) {
  ZipReader r = ZipReader::open(to_storage(make_archive({})));
  EXPECT_TRUE(r.entries().empty());
}

TEST(ZipReader, TooShort) {
  std::vector<std::byte> tiny(10, std::byte{0});
  expect_error(tiny, ErrorCode::InvalidZip, "shorter than an end-of-central-directory record");
  auto cut = make_archive(kRecords);
  cut.resize(12);
  expect_error(cut, ErrorCode::Truncated, "shorter than");
}

TEST(ZipReader, TruncatedArchive) {
  auto bytes = make_archive(kRecords);
  bytes.pop_back();
  expect_error(bytes, ErrorCode::Truncated, "no end-of-central-directory record");
}

TEST(ZipReader, ArchiveCommentRefused) {
  auto bytes = make_archive(kRecords);
  put16(bytes, bytes.size() - 2, 3);
  bytes.insert(bytes.end(), 3, std::byte{'c'});
  expect_error(bytes, ErrorCode::Truncated, "archive comment");
}

TEST(ZipReader, MultiDiskRefused) {
  auto bytes = make_archive(kRecords);
  put16(bytes, bytes.size() - 22 + 4, 1);
  expect_error(bytes, ErrorCode::InvalidZip, "multi-disk");
}

TEST(ZipReader, Zip64RecordDisagreesWithEndRecord) {
  auto bytes = make_archive(kRecords);
  put16(bytes, bytes.size() - 22 + 10, 2);  // 2 entries in the classic record, 3 in ZIP64
  put16(bytes, bytes.size() - 22 + 8, 2);
  expect_error(bytes, ErrorCode::InvalidZip, "disagree");
}

TEST(ZipReader, Zip64LocatorPointsOutside) {
  auto bytes = make_archive(kRecords);
  const size_t locator = bytes.size() - 22 - 20;
  put32(bytes, locator + 8, 0xFFFFFF00u);
  expect_error(bytes, ErrorCode::InvalidZip, "ZIP64 end record");
}

TEST(ZipReader, DirectoryNotWhereTheEndRecordSays) {
  auto bytes = strip_zip64(make_archive(kRecords));
  put32(bytes, bytes.size() - 22 + 16, get32(bytes, bytes.size() - 22 + 16) - 1);
  expect_error(bytes, ErrorCode::InvalidZip, "does not end where the end records start");
}

TEST(ZipReader, MoreEntriesThanTheDirectoryCanHold) {
  auto bytes = strip_zip64(make_archive(kRecords));
  put16(bytes, bytes.size() - 22 + 8, 1000);
  put16(bytes, bytes.size() - 22 + 10, 1000);
  expect_error(bytes, ErrorCode::InvalidZip, "cannot hold the 1000 entries");
}

TEST(ZipReader, BytesLeftInTheDirectory) {
  auto bytes = strip_zip64(make_archive(kRecords));
  put16(bytes, bytes.size() - 22 + 8, 2);
  put16(bytes, bytes.size() - 22 + 10, 2);
  expect_error(bytes, ErrorCode::InvalidZip, "bytes left in the central directory");
}

TEST(ZipReader, BadCentralSignature) {
  auto bytes = make_archive(kRecords);
  put32(bytes, cd_offset(bytes), 0x12345678);
  expect_error(bytes, ErrorCode::InvalidZip, "no central header signature");
}

TEST(ZipReader, CompressedEntry) {
  auto bytes = make_archive(kRecords);
  put16(bytes, cd_offset(bytes) + 10, 8);  // deflate
  expect_error(bytes, ErrorCode::CompressedEntry,
               "entry \"arc/data.pkl\" is compressed (method 8)");
}

TEST(ZipReader, EncryptedEntry) {
  auto bytes = make_archive(kRecords);
  put16(bytes, cd_offset(bytes) + 8, 0x0809);
  expect_error(bytes, ErrorCode::EncryptedEntry, "entry \"arc/data.pkl\" is encrypted");
  auto local = make_archive(kRecords);
  put16(local, 6, 0x0809);
  expect_error(local, ErrorCode::EncryptedEntry, "encrypted in its local header");
}

TEST(ZipReader, StoredSizesDiffer) {
  auto bytes = make_archive(kRecords);
  put32(bytes, cd_offset(bytes) + 20, 3);  // compressed size
  expect_error(bytes, ErrorCode::InvalidZip, "sizes differ");
}

TEST(ZipReader, DuplicateName) {
  auto bytes = make_archive({{"arc/a", "1"}, {"arc/b", "2"}});
  // Rename the second record to the first in both its headers.
  const size_t second = cd_entry(bytes, 1, 5);
  const size_t local = get32(bytes, second + 42);
  bytes[second + 46 + 4] = std::byte{'a'};
  bytes[local + 30 + 4] = std::byte{'a'};
  expect_error(bytes, ErrorCode::DuplicateName, "entry \"arc/a\" appears twice");
}

TEST(ZipReader, EmptyName) {
  auto bytes = strip_zip64(make_archive({{"arc/a", "1"}}));
  // Name length 0: the 5 name bytes become part of the extra field (an invalid block).
  put16(bytes, cd_offset(bytes) + 28, 0);
  put16(bytes, cd_offset(bytes) + 30, 5);
  expect_error(bytes, ErrorCode::InvalidZip, "empty name");
}

TEST(ZipReader, MissingZip64Field) {
  auto bytes = make_archive(kRecords);
  put32(bytes, cd_offset(bytes) + 24, 0xFFFFFFFFu);
  expect_error(bytes, ErrorCode::InvalidZip, "no ZIP64 extra field");
}

TEST(ZipReader, Zip64FieldTooShort) {
  auto bytes = make_archive(kRecords, {.alignment = 64, .force_zip64 = true});
  const size_t cd = cd_offset(bytes) == 0xFFFFFFFFu ? 0 : cd_offset(bytes);
  // The first entry's ZIP64 block: shrink it to 8 bytes (size only), keep the extra length.
  const size_t extra = cd + 46 + std::string("arc/data.pkl").size();
  put16(bytes, extra + 2, 8);
  put16(bytes, extra + 12, 0x7777);  // the rest becomes one more block of 12 - 4 bytes
  put16(bytes, extra + 14, 12);
  expect_error(bytes, ErrorCode::InvalidZip, "has no room for the compressed size");
}

TEST(ZipReader, ExtraBlockRunsPastTheField) {
  auto bytes = make_archive(kRecords);
  // Local header of the first record: its padding block claims more bytes than there are.
  const size_t name_len = std::string("arc/data.pkl").size();
  put16(bytes, 30 + name_len + 2, 0x7000);
  expect_error(bytes, ErrorCode::InvalidZip, "runs past the extra field");
}

TEST(ZipReader, LocalHeaderNameMismatch) {
  auto bytes = make_archive(kRecords);
  bytes[30] = std::byte{'X'};
  expect_error(bytes, ErrorCode::ZipHeaderMismatch, "names it \"Xrc/data.pkl\"");
}

TEST(ZipReader, LocalHeaderSizeMismatch) {
  auto bytes = make_archive(kRecords);
  put32(bytes, 22, 5);  // uncompressed size; the directory says 12
  expect_error(bytes, ErrorCode::ZipHeaderMismatch, "local header says 5 bytes, directory says 12");
}

TEST(ZipReader, LocalHeaderMethodMismatch) {
  auto bytes = make_archive(kRecords);
  put16(bytes, 8, 8);
  expect_error(bytes, ErrorCode::ZipHeaderMismatch, "local header says method 8");
}

TEST(ZipReader, LocalHeaderCrcMismatch) {
  auto bytes = make_archive(kRecords);
  put32(bytes, 14, 0xDEADBEEFu);
  expect_error(bytes, ErrorCode::ZipHeaderMismatch, "local header CRC 0xdeadbeef");
}

TEST(ZipReader, NoLocalHeader) {
  auto bytes = make_archive(kRecords);
  put32(bytes, 0, 0);
  expect_error(bytes, ErrorCode::InvalidZip, "no local header at offset 0");
}

TEST(ZipReader, LocalHeaderOffsetPastDirectory) {
  auto bytes = make_archive(kRecords);
  put32(bytes, cd_offset(bytes) + 42, 0x7FFFFFF0u);
  expect_error(bytes, ErrorCode::InvalidZip, "no local header at offset 2147483632");
}

TEST(ZipReader, DataRunsPastDirectory) {
  auto bytes = make_archive(kRecords);
  const size_t last = cd_entry(bytes, 2, 11);
  put32(bytes, last + 20, 1 << 20);
  put32(bytes, last + 24, 1 << 20);
  const size_t local = get32(bytes, last + 42);
  put32(bytes, local + 18, 0);  // local sizes 0: allowed with a data descriptor
  put32(bytes, local + 22, 0);
  expect_error(bytes, ErrorCode::InvalidZip, "runs past the central directory");
}

TEST(ZipReader, OverlappingEntries) {
  auto bytes = make_archive({{"arc/a", "1"}, {"arc/b", "2"}});
  const size_t first = cd_entry(bytes, 0, 5);
  put32(bytes, first + 20, 40);  // reaches into the second local header
  put32(bytes, first + 24, 40);
  put32(bytes, 18, 0);  // local sizes 0: allowed with a data descriptor
  put32(bytes, 22, 0);
  expect_error(bytes, ErrorCode::InvalidZip, "overlap");
}

TEST(ZipReader, CrcMismatch) {
  auto bytes = make_archive(kRecords);
  ZipReader clean = ZipReader::open(to_storage(bytes));
  bytes[clean.entries()[1].data_offset] = std::byte{'y'};
  ZipReader r = ZipReader::open(to_storage(bytes));
  try {
    r.check_crc(r.entries()[1]);
    FAIL() << "expected CrcMismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CrcMismatch);
    EXPECT_NE(e.message().find("entry \"arc/data/0\": data has CRC-32"), std::string::npos)
        << e.what();
  }
}

TEST(ZipWriter, RefusesMisuse) {
  MemorySink sink;
  ZipWriter w(sink);
  w.add_record("a/x", as_bytes("1"));
  try {
    w.add_record("a/x", as_bytes("2"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DuplicateName);
  }
  w.begin_record("a/y", 2);
  EXPECT_THROW(w.write(as_bytes("123")), Error);
  w.write(as_bytes("1"));
  EXPECT_THROW(w.end_record(), Error);
  EXPECT_THROW(w.finish(), Error);
  EXPECT_THROW(ZipWriter(sink, {.alignment = 48}), Error);
}

}  // namespace
}  // namespace grouplin::zip
