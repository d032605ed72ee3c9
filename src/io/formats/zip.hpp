// Private: the zip container of PyTorch `.pt` files, read strictly and written as torch.save does.
//
//   auto reader = grouplin::zip::ZipReader::open(file_bytes);    // checks the whole directory
//   const grouplin::zip::Entry* e = reader.find("archive/data.pkl");
//   reader.check_crc(*e);                                        // throws CrcMismatch
//   std::span<const std::byte> pkl = reader.bytes(*e);           // in place, zero-copy
//
//   grouplin::zip::ZipWriter writer(sink);
//   writer.add_record("archive/data.pkl", pkl_bytes);
//   writer.begin_record("archive/data/0", nbytes);               // streamed in pieces
//   writer.write(piece); ...
//   writer.end_record();
//   writer.finish();                                             // central directory, EOCD
//
// Only what torch.save produces is accepted: stored (uncompressed) entries, one disk, optional
// ZIP64 records, no archive comment. Error messages name the entry and the rule; callers add
// the file name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grouplin/file.hpp"
#include "grouplin/storage.hpp"

namespace grouplin::zip {

// CRC-32 (the zip polynomial 0xEDB88320), continued from `crc` (0 for a fresh checksum):
// libdeflate's (PCLMULQDQ / VPCLMULQDQ where the CPU has them) where the build found it;
// slice-by-8 tables otherwise (the aarch64 cross build). docs/PERFORMANCE.md has the figures.
uint32_t crc32(uint32_t crc, std::span<const std::byte> bytes);

// One record of the archive, as the central directory describes it.
struct Entry {
  std::string name;
  uint64_t header_offset = 0;  // local file header
  uint64_t data_offset = 0;    // first byte of the record's data
  uint64_t size = 0;           // bytes of data (stored: compressed == uncompressed)
  uint32_t crc32 = 0;          // as recorded in the central directory
};

// A parsed, validated archive over bytes that the reader keeps alive.
// Thread-safety: const methods may be called concurrently.
class ZipReader {
 public:
  // Parses and checks the end records, the central directory and every local header of the
  // archive in `file` (the whole file). Throws Error with InvalidZip / Truncated (structure or
  // bounds), CompressedEntry, EncryptedEntry, DuplicateName, ZipHeaderMismatch. Does not read
  // record data (see check_crc).
  static ZipReader open(std::shared_ptr<Storage> file);

  // Entries in central-directory order.
  const std::vector<Entry>& entries() const { return entries_; }
  // The entry named exactly `name`, or nullptr.
  const Entry* find(std::string_view name) const;
  // The record's data, in place. Valid while this reader (or the file Storage) lives.
  std::span<const std::byte> bytes(const Entry& entry) const;
  // A Storage over the record's data that keeps the file bytes alive (zero-copy); writable when
  // the file's Storage is (a copy-on-write mapping), else read-only.
  std::shared_ptr<Storage> storage(const Entry& entry) const;
  // Reads the record and compares its CRC-32 with the directory. Throws Error(CrcMismatch).
  void check_crc(const Entry& entry) const;

 private:
  explicit ZipReader(std::shared_ptr<Storage> file) : file_(std::move(file)) {}

  std::shared_ptr<Storage> file_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// Writes an archive the way torch.save (miniz) lays it out: stored records whose data start on
// a 64-byte boundary (padding in an "FB" local extra field), a data descriptor after each
// record, ZIP64 extra fields for records or offsets at or past 4 GiB, and always a ZIP64 end
// record + locator before the classic end record. Streams: only the directory is kept in memory.
// Not thread-safe.
class ZipWriter {
 public:
  struct Options {
    uint64_t alignment = 64;   // record data alignment (a power of two, at most 4096)
    bool force_zip64 = false;  // ZIP64 extra fields on every record (tests of the ZIP64 paths)
    std::string context = "zip writer";  // starts error messages (`saving "out.pt"`)
  };

  // `sink` must outlive the writer; nothing is written before the first record.
  explicit ZipWriter(FileSink& sink);
  ZipWriter(FileSink& sink, Options options);

  // Starts a record of exactly `size` bytes. Throws Error(DuplicateName) for a name already
  // written, Error(InvalidArgument) for an empty name, a name over 65535 bytes, or a record
  // still open.
  void begin_record(std::string_view name, uint64_t size);
  // Appends data to the open record. Throws Error(InvalidArgument) past the declared size.
  void write(std::span<const std::byte> bytes);
  // write() without the CRC-32, for callers that compute it elsewhere (on another thread): the
  // record must then be closed with end_record(crc). Throws as write().
  void write_without_crc(std::span<const std::byte> bytes);
  // Closes the open record (writes its data descriptor). Throws Error(InvalidArgument) if
  // fewer bytes than declared were written, or if write_without_crc was used (use the overload).
  void end_record();
  // Closes the open record with `crc`, which the caller computed over all of the record's bytes.
  // Requires: crc is their CRC-32 (nothing can check it here).
  void end_record(uint32_t crc);
  // begin_record + write + end_record.
  void add_record(std::string_view name, std::span<const std::byte> bytes);
  // Writes the central directory and the end records. No record may be open.
  void finish();

  // Where a record begun at file offset `offset` puts its data, and where the next record
  // starts (after its data descriptor), as begin_record and end_record will write it: lets a
  // caller know every record's place before writing (to align its own buffers on it).
  struct RecordLayout {
    uint64_t data_offset = 0;
    uint64_t end_offset = 0;
    bool zip64 = false;
  };
  static RecordLayout record_layout(uint64_t offset, std::string_view name, uint64_t size,
                                    const Options& options);

 private:
  struct Written {
    std::string name;
    uint64_t header_offset;
    uint64_t size;
    uint32_t crc32;
    bool zip64;
  };

  void put(std::span<const std::byte> bytes);
  // Throws InvalidArgument unless a record is open with room for n more bytes.
  void check_room(size_t n) const;

  FileSink& sink_;
  Options options_;
  std::vector<Written> written_;
  std::unordered_map<std::string, size_t> names_;
  bool open_ = false;
  bool finished_ = false;
  uint64_t open_written_ = 0;
  uint32_t open_crc_ = 0;
  bool open_crc_partial_ = false;  // write_without_crc bypassed open_crc_
};

}  // namespace grouplin::zip
