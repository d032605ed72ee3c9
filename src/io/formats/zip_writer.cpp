// Streaming zip writer with torch.save's layout (see io/zip.hpp). Headers are built in small
// buffers; record data goes straight from the caller to the sink, CRC computed on the way.
#include <cstring>

#include "grouplin/error.hpp"
#include "io/formats/zip.hpp"

namespace grouplin::zip {
namespace {

constexpr uint32_t kMax32 = 0xFFFFFFFFu;
constexpr uint16_t kMax16 = 0xFFFFu;
constexpr uint16_t kFlags = 0x0808;  // data descriptor follows the data; names are UTF-8
constexpr uint16_t kVersion = 20;    // 2.0: stored entries
constexpr uint16_t kVersionZip64 = 45;
constexpr uint16_t kPaddingId = 0x4246;  // "FB", the id torch.save gives its padding field

class Bytes {
 public:
  void u16(uint16_t v) { raw(v, 2); }
  void u32(uint32_t v) { raw(v, 4); }
  void u64(uint64_t v) { raw(v, 8); }
  void text(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    buf_.insert(buf_.end(), p, p + s.size());
  }
  void fill(std::byte b, size_t n) { buf_.insert(buf_.end(), n, b); }
  std::span<const std::byte> span() const { return buf_; }

 private:
  void raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
  std::vector<std::byte> buf_;
};

uint32_t clamp32(uint64_t v) { return v >= kMax32 ? kMax32 : static_cast<uint32_t>(v); }

}  // namespace

ZipWriter::ZipWriter(FileSink& sink) : ZipWriter(sink, Options{}) {}

ZipWriter::ZipWriter(FileSink& sink, Options options) : sink_(sink), options_(options) {
  uint64_t a = options_.alignment;
  if (a == 0 || (a & (a - 1)) != 0 || a > 4096) {
    throw Error(ErrorCode::InvalidArgument, options_.context + ": alignment " + std::to_string(a) +
                                                " is not a power of two up to 4096");
  }
}

void ZipWriter::put(std::span<const std::byte> bytes) {
  if (!bytes.empty()) sink_.write(bytes);
}

ZipWriter::RecordLayout ZipWriter::record_layout(uint64_t offset, std::string_view name,
                                                 uint64_t size, const Options& options) {
  RecordLayout r;
  r.zip64 = options.force_zip64 || size >= kMax32 || offset >= kMax32;
  const uint64_t zip64_len = r.zip64 ? 4 + 16 : 0;
  const uint64_t start = offset + 30 + name.size() + zip64_len + 4;  // + the padding field
  r.data_offset = start + (options.alignment - start % options.alignment) % options.alignment;
  r.end_offset = r.data_offset + size + (r.zip64 ? 24 : 16);  // + the data descriptor
  return r;
}

void ZipWriter::begin_record(std::string_view name, uint64_t size) {
  if (open_ || finished_) {
    throw Error(ErrorCode::InvalidArgument, options_.context + ": record " +
                                                quote(std::string(name)) +
                                                " started while another is open or after finish");
  }
  if (name.empty() || name.size() > kMax16) {
    throw Error(ErrorCode::InvalidArgument, options_.context + ": record name of " +
                                                std::to_string(name.size()) +
                                                " bytes (must be 1 to 65535)");
  }
  if (names_.count(std::string(name)) != 0) {
    throw Error(ErrorCode::DuplicateName,
                options_.context + ": record " + quote(std::string(name)) + " written twice");
  }
  const uint64_t offset = sink_.position();
  const RecordLayout layout = record_layout(offset, name, size, options_);
  const bool zip64 = layout.zip64;

  Bytes h;
  h.u32(0x04034b50);
  h.u16(zip64 ? kVersionZip64 : kVersion);
  h.u16(kFlags);
  h.u16(0);  // stored
  h.u16(0);  // time
  h.u16(0);  // date
  h.u32(0);  // CRC: in the data descriptor
  h.u32(zip64 ? kMax32 : clamp32(size));
  h.u32(zip64 ? kMax32 : clamp32(size));
  const uint64_t zip64_len = zip64 ? 4 + 16 : 0;
  const uint64_t pad = layout.data_offset - (offset + 30 + name.size() + zip64_len + 4);
  h.u16(static_cast<uint16_t>(name.size()));
  h.u16(static_cast<uint16_t>(zip64_len + 4 + pad));
  h.text(name);
  if (zip64) {
    h.u16(0x0001);
    h.u16(16);
    h.u64(size);
    h.u64(size);
  }
  h.u16(kPaddingId);
  h.u16(static_cast<uint16_t>(pad));
  h.fill(std::byte{'Z'}, static_cast<size_t>(pad));
  put(h.span());

  names_.emplace(std::string(name), written_.size());
  written_.push_back({std::string(name), offset, size, 0, zip64});
  open_ = true;
  open_written_ = 0;
  open_crc_ = 0;
  open_crc_partial_ = false;
}

void ZipWriter::check_room(size_t n) const {
  if (!open_)
    throw Error(ErrorCode::InvalidArgument, options_.context + ": write with no open record");
  const Written& w = written_.back();
  if (n > w.size - open_written_) {
    throw Error(ErrorCode::InvalidArgument, options_.context + ": record " + quote(w.name) +
                                                " declared " + std::to_string(w.size) +
                                                " bytes, got more");
  }
}

void ZipWriter::write(std::span<const std::byte> bytes) {
  check_room(bytes.size());
  open_crc_ = crc32(open_crc_, bytes);
  put(bytes);
  open_written_ += bytes.size();
}

void ZipWriter::write_without_crc(std::span<const std::byte> bytes) {
  check_room(bytes.size());
  open_crc_partial_ = true;
  put(bytes);
  open_written_ += bytes.size();
}

void ZipWriter::end_record() {
  if (open_crc_partial_) {
    throw Error(ErrorCode::InvalidArgument,
                options_.context + ": record " + quote(written_.back().name) +
                    " has bytes written without CRC: close it with end_record(crc)");
  }
  end_record(open_crc_);
}

void ZipWriter::end_record(uint32_t crc) {
  if (!open_)
    throw Error(ErrorCode::InvalidArgument, options_.context + ": end_record with no open record");
  Written& w = written_.back();
  if (open_written_ != w.size) {
    throw Error(ErrorCode::InvalidArgument, options_.context + ": record " + quote(w.name) +
                                                " declared " + std::to_string(w.size) +
                                                " bytes, got " + std::to_string(open_written_));
  }
  w.crc32 = crc;
  Bytes d;
  d.u32(0x08074b50);
  d.u32(w.crc32);
  if (w.zip64) {
    d.u64(w.size);
    d.u64(w.size);
  } else {
    d.u32(static_cast<uint32_t>(w.size));
    d.u32(static_cast<uint32_t>(w.size));
  }
  put(d.span());
  open_ = false;
  open_crc_partial_ = false;
}

void ZipWriter::add_record(std::string_view name, std::span<const std::byte> bytes) {
  begin_record(name, bytes.size());
  write(bytes);
  end_record();
}

void ZipWriter::finish() {
  if (open_ || finished_) {
    throw Error(ErrorCode::InvalidArgument,
                options_.context + ": finish with a record open or twice");
  }
  const uint64_t cd_offset = sink_.position();
  for (const Written& w : written_) {
    const bool big_size = options_.force_zip64 || w.size >= kMax32;
    const bool big_offset = options_.force_zip64 || w.header_offset >= kMax32;
    const uint16_t extra = static_cast<uint16_t>(
        (big_size || big_offset) ? 4 + (big_size ? 16 : 0) + (big_offset ? 8 : 0) : 0);
    Bytes h;
    h.u32(0x02014b50);
    h.u16(w.zip64 ? kVersionZip64 : kVersion);  // made by (MS-DOS attributes)
    h.u16(w.zip64 ? kVersionZip64 : kVersion);  // needed
    h.u16(kFlags);
    h.u16(0);  // stored
    h.u16(0);  // time
    h.u16(0);  // date
    h.u32(w.crc32);
    h.u32(big_size ? kMax32 : static_cast<uint32_t>(w.size));
    h.u32(big_size ? kMax32 : static_cast<uint32_t>(w.size));
    h.u16(static_cast<uint16_t>(w.name.size()));
    h.u16(extra);
    h.u16(0);  // comment
    h.u16(0);  // disk
    h.u16(0);  // internal attributes
    h.u32(0);  // external attributes
    h.u32(big_offset ? kMax32 : static_cast<uint32_t>(w.header_offset));
    h.text(w.name);
    if (extra != 0) {
      h.u16(0x0001);
      h.u16(static_cast<uint16_t>(extra - 4));
      if (big_size) {
        h.u64(w.size);
        h.u64(w.size);
      }
      if (big_offset) h.u64(w.header_offset);
    }
    put(h.span());
  }
  const uint64_t zip64_end = sink_.position();
  const uint64_t cd_size = zip64_end - cd_offset;
  const uint64_t n = written_.size();

  Bytes e;
  e.u32(0x06064b50);  // ZIP64 end of central directory record
  e.u64(44);
  e.u16(kVersionZip64);
  e.u16(kVersionZip64);
  e.u32(0);
  e.u32(0);
  e.u64(n);
  e.u64(n);
  e.u64(cd_size);
  e.u64(cd_offset);
  e.u32(0x07064b50);  // ZIP64 locator
  e.u32(0);
  e.u64(zip64_end);
  e.u32(1);
  e.u32(0x06054b50);  // end of central directory record
  e.u16(0);
  e.u16(0);
  e.u16(n >= kMax16 ? kMax16 : static_cast<uint16_t>(n));
  e.u16(n >= kMax16 ? kMax16 : static_cast<uint16_t>(n));
  e.u32(clamp32(cd_size));
  e.u32(clamp32(cd_offset));
  e.u16(0);  // comment
  put(e.span());
  finished_ = true;
}

}  // namespace grouplin::zip
