// File access: read-only mappings in, atomic replacement out.
//
//   auto file = grouplin::MappedFile::open("model.safetensors");
//   file->will_need(0, file->size());                     // read-ahead, avoids 4 KiB faults
//   auto bytes = file->storage(0, file->size());             // zero-copy, keeps the mapping alive
//
//   auto out = grouplin::AtomicFile::create("out.safetensors");
//   out->write({bytes->data(), bytes->size()});  // goes to a temporary file in the same folder
//   out->commit();       // fsync, rename over the final name (the commit point), fsync the folder
//   // destroyed without commit(): the temporary file is removed, the old file is untouched
//
// Writers take a FileSink& so that tests can inject faults (short writes, failures midway); the
// last steps of AtomicFile::commit (fsync, close, rename) go through an internal interface that
// GroupLin's own tests replace the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "grouplin/storage.hpp"

namespace grouplin {

// How a file is mapped: ReadOnly, or CopyOnWrite (private pages that a write copies into this
// process, so that the file never changes: what a caller who may write into the tensors needs).
enum class MapMode { ReadOnly, CopyOnWrite };

class MappedFile : public std::enable_shared_from_this<MappedFile> {
 public:
  // Maps the whole file. Throws Error(IoError) naming the path and the OS error.
  static std::shared_ptr<MappedFile> open(const std::string& path,
                                          MapMode mode = MapMode::ReadOnly);
  ~MappedFile();

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // Read-ahead hint for [offset, offset + len) (clamped to the file).
  void will_need(size_t offset, size_t len) const;
  // Storage over [offset, offset + len) that keeps this mapping alive: read-only, or writable
  // for a CopyOnWrite mapping. Throws Error(OutOfBounds) if the range is outside the file.
  std::shared_ptr<Storage> storage(size_t offset, size_t len) const;

 private:
  MappedFile(std::string path, const std::byte* data, size_t size, MapMode mode);
  std::string path_;
  const std::byte* data_;
  size_t size_;
  MapMode mode_;
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

class AtomicFile;
namespace detail {
class CommitCalls;  // the commit steps, replaceable (internal: src/io/checkpoints/commit_calls.hpp)
std::unique_ptr<AtomicFile> create_atomic_file(const std::string& path, CommitCalls& calls);
}  // namespace detail

// Writes to a temporary file beside `path`; commit() fsyncs and renames it over `path`.
class AtomicFile : public FileSink {
 public:
  // Creates the temporary file (0666 less the umask, or the mode of the file it will replace).
  // Throws Error(IoError) naming `path` if it cannot be created.
  static std::unique_ptr<AtomicFile> create(const std::string& path);
  ~AtomicFile() override;  // removes the temporary file unless committed

  void write(std::span<const std::byte> bytes) override;
  uint64_t position() const override { return position_; }
  // Flushes the data (fsync), closes the temporary file and renames it over `path`: the rename
  // is the commit point. Throws Error(IoError) naming `path` when a step up to the rename fails
  // (`path` is then untouched; the destructor removes the temporary file), or when called twice.
  // Never throws after the rename: the file is committed then, whatever follows. Flushing the
  // folder, which makes the rename survive a power loss, comes last; its failure is kept in
  // folder_flush_error() instead.
  void commit() override;
  // After commit(): "" when the folder was flushed, else why not (the new file is in place, but
  // a crash soon after may bring back the old directory entry). Callers that cannot act on this
  // (the savers and convert: the data itself was flushed, and the OS writes the folder back on
  // its own shortly) may ignore it.
  std::string folder_flush_error() const;
  const std::string& temp_path() const { return temp_path_; }

 private:
  friend std::unique_ptr<AtomicFile> detail::create_atomic_file(const std::string& path,
                                                                detail::CommitCalls& calls);
  AtomicFile(std::string path, std::string temp_path, int fd, detail::CommitCalls& calls);
  std::string path_;
  std::string temp_path_;
  int fd_;
  detail::CommitCalls& calls_;
  uint64_t position_ = 0;
  bool committed_ = false;
  int folder_flush_errno_ = 0;  // set by commit() after the rename: no allocation there
};

}  // namespace grouplin
