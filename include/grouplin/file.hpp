// File access: read-only mappings in, atomic replacement out.
//
//   auto file = grouplin::MappedFile::open("model.safetensors");
//   file->will_need(0, file->size());                     // read-ahead, avoids 4 KiB faults
//   auto bytes = file->storage(offset, len);                 // zero-copy, keeps the mapping alive
//
//   auto out = grouplin::AtomicFile::create("out.safetensors");
//   out->write(bytes);   // goes to a temporary file in the same folder
//   out->commit();       // flush, fsync, rename over the final name
//   // destroyed without commit(): the temporary file is removed, the old file is untouched
//
// Writers take a FileSink& so that tests can inject faults (short writes, failures midway).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "grouplin/storage.hpp"

namespace grouplin {

class MappedFile : public std::enable_shared_from_this<MappedFile> {
 public:
  // Maps the whole file read-only. Throws Error(IoError) naming the path and the OS error.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // Read-ahead hint for [offset, offset + len) (clamped to the file).
  void will_need(size_t offset, size_t len) const;
  // Read-only Storage over [offset, offset + len) that keeps this mapping alive.
  // Throws Error(OutOfBounds) if the range is outside the file.
  std::shared_ptr<Storage> storage(size_t offset, size_t len) const;

 private:
  MappedFile(std::string path, const std::byte* data, size_t size);
  std::string path_;
  const std::byte* data_;
  size_t size_;
};

// Where writers put their bytes.
class FileSink {
 public:
  virtual ~FileSink() = default;
  // Appends all of `bytes`. Throws Error(IoError) on failure.
  virtual void write(std::span<const std::byte> bytes) = 0;
  // Bytes written so far.
  virtual uint64_t position() const = 0;
  // Makes the written bytes the file's content. Throws Error(IoError).
  virtual void commit() = 0;
};

// Writes to a temporary file beside `path`; commit() fsyncs and renames it over `path`.
class AtomicFile : public FileSink {
 public:
  // Throws Error(IoError) if the temporary file cannot be created.
  static std::unique_ptr<AtomicFile> create(const std::string& path);
  ~AtomicFile() override;  // removes the temporary file unless committed

  void write(std::span<const std::byte> bytes) override;
  uint64_t position() const override { return position_; }
  void commit() override;
  const std::string& temp_path() const { return temp_path_; }

 private:
  AtomicFile(std::string path, std::string temp_path, int fd);
  std::string path_;
  std::string temp_path_;
  int fd_;
  uint64_t position_ = 0;
  bool committed_ = false;
};

}  // namespace grouplin
