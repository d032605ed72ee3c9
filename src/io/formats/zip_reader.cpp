// Strict reader of the zip archives torch.save writes. Validation order: end records → central
// directory (size, caps, bounds, each entry) → local headers → overlaps. Record data is never
// copied: bytes() and storage() point into the file.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#ifdef GROUPLIN_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include "grouplin/error.hpp"
#include "io/formats/zip.hpp"

namespace grouplin::zip {
namespace {

constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint64_t kLocalHeaderSize = 30;
constexpr uint64_t kCentralHeaderSize = 46;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kZip64EndSize = 56;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint32_t kMax32 = 0xFFFFFFFFu;
constexpr uint16_t kMax16 = 0xFFFFu;
// General-purpose flags: bit 0 encrypted, bit 6 strong encryption, bit 13 encrypted directory.
constexpr uint16_t kEncryptionFlags = 0x0001 | 0x0040 | 0x2000;
constexpr uint16_t kDataDescriptorFlag = 0x0008;

#ifndef GROUPLIN_HAVE_LIBDEFLATE
// CRC-32 tables for slice-by-8 (builds without libdeflate): kCrcTables[k][b] is the CRC of byte
// b followed by k zero bytes.
struct CrcTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
};

constexpr CrcTables make_crc_tables() {
  CrcTables tables;
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    tables.t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (size_t i = 0; i < 256; ++i) {
      uint32_t prev = tables.t[k - 1][i];
      tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xFF];
    }
  }
  return tables;
}

constexpr CrcTables kCrcTables = make_crc_tables();
#endif

uint16_t le16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) |
                               (std::to_integer<uint16_t>(p[1]) << 8));
}
uint32_t le32(const std::byte* p) {
  return std::to_integer<uint32_t>(p[0]) | (std::to_integer<uint32_t>(p[1]) << 8) |
         (std::to_integer<uint32_t>(p[2]) << 16) | (std::to_integer<uint32_t>(p[3]) << 24);
}
uint64_t le64(const std::byte* p) { return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32); }

// [off, off + n) lies inside [0, len).
bool fits(uint64_t off, uint64_t n, uint64_t len) { return n <= len && off <= len - n; }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

[[noreturn]] void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

// What the ZIP64 extended-information field of one header holds.
struct Zip64Field {
  bool present = false;
  const std::byte* data = nullptr;
  uint16_t size = 0;
};

// Walks the extra-field blocks of a header: they must tile [extra, extra + len) exactly.
// Returns the ZIP64 block if there is one (at most one is allowed).
Zip64Field parse_extra(const std::byte* extra, uint64_t len, const std::string& where) {
  Zip64Field zip64;
  uint64_t pos = 0;
  while (pos < len) {
    if (!fits(pos, 4, len))
      fail(ErrorCode::InvalidZip, where + ": extra field ends inside a block header");
    uint16_t id = le16(extra + pos);
    uint16_t size = le16(extra + pos + 2);
    if (!fits(pos + 4, size, len)) {
      fail(ErrorCode::InvalidZip, where + ": extra block 0x" + hex32(id).substr(6) + " of " +
                                      std::to_string(size) + " bytes runs past the extra field");
    }
    if (id == kZip64ExtraId) {
      if (zip64.present) fail(ErrorCode::InvalidZip, where + ": two ZIP64 extra blocks");
      zip64 = {true, extra + pos + 4, size};
    }
    pos += 4 + static_cast<uint64_t>(size);
  }
  return zip64;
}

// Reads the next 8-byte value of a ZIP64 block for a field whose 32-bit value is saturated.
uint64_t take_zip64(const Zip64Field& zip64, uint16_t& used, const std::string& where,
                    const char* field) {
  if (!zip64.present) {
    fail(ErrorCode::InvalidZip,
         where + ": " + field + " is 0xffffffff but there is no ZIP64 extra field");
  }
  if (!fits(used, 8, zip64.size)) {
    fail(ErrorCode::InvalidZip, where + ": ZIP64 extra field of " + std::to_string(zip64.size) +
                                    " bytes has no room for the " + field);
  }
  uint64_t v = le64(zip64.data + used);
  used = static_cast<uint16_t>(used + 8);
  return v;
}

struct EndRecords {
  uint64_t entries = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t cd_end_limit = 0;  // where the directory must end: the first end record
};

EndRecords read_end_records(const std::byte* base, uint64_t len) {
  bool starts_like_zip = len >= 4 && le32(base) == kLocalSignature;
  if (len < kEndSize) {
    fail(starts_like_zip ? ErrorCode::Truncated : ErrorCode::InvalidZip,
         "archive of " + std::to_string(len) +
             " bytes is shorter than an end-of-central-directory record (22 bytes)");
  }
  uint64_t eocd = len - kEndSize;
  const std::byte* e = base + eocd;
  if (le32(e) != kEndSignature || le16(e + 20) != 0) {
    fail(starts_like_zip ? ErrorCode::Truncated : ErrorCode::InvalidZip,
         "no end-of-central-directory record in the last 22 bytes (the file is truncated, has "
         "an archive comment, or is not a zip archive)");
  }
  uint16_t disk = le16(e + 4), cd_disk = le16(e + 6);
  uint16_t entries_disk = le16(e + 8), entries16 = le16(e + 10);
  uint32_t cd_size32 = le32(e + 12), cd_offset32 = le32(e + 16);
  if (disk != 0 || cd_disk != 0 || entries_disk != entries16) {
    fail(ErrorCode::InvalidZip, "end record describes a multi-disk archive (disk " +
                                    std::to_string(disk) + ", directory disk " +
                                    std::to_string(cd_disk) + ")");
  }
  EndRecords r{entries16, cd_offset32, cd_size32, eocd};

  if (eocd < kZip64LocatorSize || le32(base + eocd - kZip64LocatorSize) != kZip64LocatorSignature) {
    return r;
  }
  uint64_t locator = eocd - kZip64LocatorSize;
  const std::byte* l = base + locator;
  uint32_t z_disk = le32(l + 4);
  uint64_t z_offset = le64(l + 8);
  uint32_t total_disks = le32(l + 16);
  if (z_disk != 0 || total_disks > 1) {
    fail(ErrorCode::InvalidZip, "ZIP64 locator describes a multi-disk archive");
  }
  if (!fits(z_offset, kZip64EndSize, locator)) {
    fail(ErrorCode::InvalidZip, "ZIP64 end record at offset " + std::to_string(z_offset) +
                                    " does not fit before its locator at " +
                                    std::to_string(locator));
  }
  const std::byte* z = base + z_offset;
  if (le32(z) != kZip64EndSignature) {
    fail(ErrorCode::InvalidZip,
         "no ZIP64 end record signature at offset " + std::to_string(z_offset));
  }
  uint64_t record_size = le64(z + 4);
  if (record_size < kZip64EndSize - 12 || record_size != locator - z_offset - 12) {
    fail(ErrorCode::InvalidZip, "ZIP64 end record at offset " + std::to_string(z_offset) +
                                    " declares " + std::to_string(record_size) +
                                    " bytes but its locator is at " + std::to_string(locator));
  }
  uint32_t z_this_disk = le32(z + 16), z_cd_disk = le32(z + 20);
  uint64_t z_entries_disk = le64(z + 24), z_entries = le64(z + 32);
  uint64_t z_cd_size = le64(z + 40), z_cd_offset = le64(z + 48);
  if (z_this_disk != 0 || z_cd_disk != 0 || z_entries_disk != z_entries) {
    fail(ErrorCode::InvalidZip, "ZIP64 end record describes a multi-disk archive");
  }
  if ((entries16 != kMax16 && entries16 != z_entries) ||
      (cd_size32 != kMax32 && cd_size32 != z_cd_size) ||
      (cd_offset32 != kMax32 && cd_offset32 != z_cd_offset)) {
    fail(ErrorCode::InvalidZip, "end record and ZIP64 end record disagree (entries " +
                                    std::to_string(entries16) + " vs " + std::to_string(z_entries) +
                                    ", directory offset " + std::to_string(cd_offset32) + " vs " +
                                    std::to_string(z_cd_offset) + ")");
  }
  return {z_entries, z_cd_offset, z_cd_size, z_offset};
}

}  // namespace

uint32_t crc32(uint32_t crc, std::span<const std::byte> bytes) {
#ifdef GROUPLIN_HAVE_LIBDEFLATE
  return libdeflate_crc32(crc, bytes.data(), bytes.size());
#else
  const auto& t = kCrcTables.t;
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  crc = ~crc;
  while (n >= 8) {
    uint32_t a = le32(p) ^ crc;
    uint32_t b = le32(p + 4);
    crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^
          t[3][b & 0xFF] ^ t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = t[0][(crc ^ std::to_integer<uint32_t>(*p++)) & 0xFF] ^ (crc >> 8);
  return ~crc;
#endif
}

ZipReader ZipReader::open(std::shared_ptr<Storage> file) {
  if (!file) throw Error(ErrorCode::InvalidArgument, "ZipReader::open: null storage");
  const std::byte* base = file->data();
  const uint64_t len = file->size();
  ZipReader reader(std::move(file));

  const EndRecords end = read_end_records(base, len);
  if (!fits(end.cd_offset, end.cd_size, end.cd_end_limit) ||
      end.cd_offset + end.cd_size != end.cd_end_limit) {
    fail(ErrorCode::InvalidZip, "central directory at offset " + std::to_string(end.cd_offset) +
                                    " of " + std::to_string(end.cd_size) +
                                    " bytes does not end where the end records start (offset " +
                                    std::to_string(end.cd_end_limit) + ")");
  }
  // Cap before allocating: every directory entry takes at least 46 bytes.
  if (end.entries > end.cd_size / kCentralHeaderSize) {
    fail(ErrorCode::InvalidZip, "central directory of " + std::to_string(end.cd_size) +
                                    " bytes cannot hold the " + std::to_string(end.entries) +
                                    " entries the end record announces");
  }
  reader.entries_.reserve(end.entries);

  const uint64_t cd_end = end.cd_offset + end.cd_size;
  uint64_t pos = end.cd_offset;
  for (uint64_t i = 0; i < end.entries; ++i) {
    const std::string at = "central directory entry " + std::to_string(i);
    if (!fits(pos, kCentralHeaderSize, cd_end) || le32(base + pos) != kCentralSignature) {
      fail(ErrorCode::InvalidZip, at + " (offset " + std::to_string(pos) +
                                      "): no central header signature within the directory");
    }
    const std::byte* h = base + pos;
    uint16_t flags = le16(h + 8), method = le16(h + 10);
    uint32_t crc = le32(h + 16), csize32 = le32(h + 20), usize32 = le32(h + 24);
    uint16_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
    uint16_t disk16 = le16(h + 34);
    uint32_t offset32 = le32(h + 42);
    uint64_t variable = uint64_t{name_len} + extra_len + comment_len;
    if (!fits(pos + kCentralHeaderSize, variable, cd_end)) {
      fail(ErrorCode::InvalidZip, at + ": name, extra field and comment (" +
                                      std::to_string(variable) + " bytes) run past the directory");
    }
    Entry entry;
    entry.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
    const std::string where = "entry " + quote(entry.name);
    if (entry.name.empty()) fail(ErrorCode::InvalidZip, at + " has an empty name");
    if ((flags & kEncryptionFlags) != 0) {
      fail(ErrorCode::EncryptedEntry, where + " is encrypted (flags " + hex32(flags) + ")");
    }
    if (method != 0) {
      fail(ErrorCode::CompressedEntry, where + " is compressed (method " + std::to_string(method) +
                                           "); only stored entries are read");
    }
    Zip64Field zip64 = parse_extra(h + kCentralHeaderSize + name_len, extra_len, where);
    uint16_t used = 0;
    uint64_t usize = usize32 == kMax32 ? take_zip64(zip64, used, where, "size") : usize32;
    uint64_t csize =
        csize32 == kMax32 ? take_zip64(zip64, used, where, "compressed size") : csize32;
    uint64_t offset =
        offset32 == kMax32 ? take_zip64(zip64, used, where, "local header offset") : offset32;
    uint32_t disk = disk16;
    if (disk16 == kMax16) {
      if (!zip64.present || !fits(used, 4, zip64.size)) {
        fail(ErrorCode::InvalidZip, where + ": disk number 0xffff without a ZIP64 value");
      }
      disk = le32(zip64.data + used);
    }
    if (disk != 0) fail(ErrorCode::InvalidZip, where + " is on disk " + std::to_string(disk));
    if (csize != usize) {
      fail(ErrorCode::InvalidZip, where + " is stored but its sizes differ (" +
                                      std::to_string(csize) + " compressed, " +
                                      std::to_string(usize) + " uncompressed)");
    }
    if (reader.index_.count(entry.name) != 0) {
      fail(ErrorCode::DuplicateName, where + " appears twice in the central directory");
    }
    entry.header_offset = offset;
    entry.size = usize;
    entry.crc32 = crc;
    reader.index_.emplace(entry.name, reader.entries_.size());
    reader.entries_.push_back(std::move(entry));
    pos += kCentralHeaderSize + variable;
  }
  if (pos != cd_end) {
    fail(ErrorCode::InvalidZip, std::to_string(cd_end - pos) +
                                    " bytes left in the central directory after its " +
                                    std::to_string(end.entries) + " entries");
  }

  // Local headers: they and the data must lie before the central directory and agree with it.
  for (Entry& entry : reader.entries_) {
    const std::string where = "entry " + quote(entry.name);
    const uint64_t lho = entry.header_offset;
    if (!fits(lho, kLocalHeaderSize, end.cd_offset) || le32(base + lho) != kLocalSignature) {
      fail(ErrorCode::InvalidZip, where + ": no local header at offset " + std::to_string(lho) +
                                      " before the central directory");
    }
    const std::byte* h = base + lho;
    uint16_t flags = le16(h + 6), method = le16(h + 8);
    uint32_t crc = le32(h + 14), csize32 = le32(h + 18), usize32 = le32(h + 22);
    uint16_t name_len = le16(h + 26), extra_len = le16(h + 28);
    if (!fits(lho + kLocalHeaderSize, uint64_t{name_len} + extra_len, end.cd_offset)) {
      fail(ErrorCode::InvalidZip, where + ": local name and extra field run past the directory");
    }
    std::string_view local_name(reinterpret_cast<const char*>(h + kLocalHeaderSize), name_len);
    if (local_name != entry.name) {
      fail(ErrorCode::ZipHeaderMismatch, where + ": local header at offset " + std::to_string(lho) +
                                             " names it " + quote(local_name));
    }
    if ((flags & kEncryptionFlags) != 0) {
      fail(ErrorCode::EncryptedEntry,
           where + " is encrypted in its local header (flags " + hex32(flags) + ")");
    }
    if (method != 0) {
      fail(ErrorCode::ZipHeaderMismatch, where + ": local header says method " +
                                             std::to_string(method) + ", directory says stored");
    }
    // With a data descriptor (flag bit 3) the local CRC and sizes may be zero; 0xffffffff
    // defers to a ZIP64 field. Otherwise they must equal the directory's.
    const bool descriptor = (flags & kDataDescriptorFlag) != 0;
    const uint32_t size32 = entry.size >= kMax32 ? kMax32 : static_cast<uint32_t>(entry.size);
    for (uint32_t local : {csize32, usize32}) {
      if (local != size32 && local != kMax32 && !(descriptor && local == 0)) {
        fail(ErrorCode::ZipHeaderMismatch, where + ": local header says " + std::to_string(local) +
                                               " bytes, directory says " +
                                               std::to_string(entry.size));
      }
    }
    if (crc != entry.crc32 && !(descriptor && crc == 0)) {
      fail(ErrorCode::ZipHeaderMismatch,
           where + ": local header CRC " + hex32(crc) + ", directory CRC " + hex32(entry.crc32));
    }
    parse_extra(h + kLocalHeaderSize + name_len, extra_len, where + " (local header)");
    entry.data_offset = lho + kLocalHeaderSize + name_len + extra_len;
    if (!fits(entry.data_offset, entry.size, end.cd_offset)) {
      fail(ErrorCode::InvalidZip, where + ": data at offset " + std::to_string(entry.data_offset) +
                                      " of " + std::to_string(entry.size) +
                                      " bytes runs past the central directory at " +
                                      std::to_string(end.cd_offset));
    }
  }

  // No two records may share bytes.
  std::vector<const Entry*> by_offset;
  by_offset.reserve(reader.entries_.size());
  for (const Entry& e : reader.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->header_offset < b->header_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry* prev = by_offset[i - 1];
    const Entry* next = by_offset[i];
    if (next->header_offset < prev->data_offset + prev->size) {
      fail(ErrorCode::InvalidZip,
           "entries " + quote(prev->name) + " and " + quote(next->name) +
               " overlap (local header at " + std::to_string(next->header_offset) +
               " inside data ending at " + std::to_string(prev->data_offset + prev->size) + ")");
    }
  }
  return reader;
}

const Entry* ZipReader::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::span<const std::byte> ZipReader::bytes(const Entry& entry) const {
  return {file_->data() + entry.data_offset, static_cast<size_t>(entry.size)};
}

std::shared_ptr<Storage> ZipReader::storage(const Entry& entry) const {
  // Writable only over writable bytes (a copy-on-write mapping), as the archive's own storage; it
  // knows its place in the file (Storage::root_offset).
  return Storage::slice(file_, static_cast<size_t>(entry.data_offset),
                        static_cast<size_t>(entry.size));
}

void ZipReader::check_crc(const Entry& entry) const {
  uint32_t actual = crc32(0, bytes(entry));
  if (actual != entry.crc32) {
    fail(ErrorCode::CrcMismatch, "entry " + quote(entry.name) + ": data has CRC-32 " +
                                     hex32(actual) + " but the directory records " +
                                     hex32(entry.crc32));
  }
}

}  // namespace grouplin::zip
