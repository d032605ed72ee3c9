// Reference-counted byte buffers that tensors view.
//
//   auto heap = grouplin::Storage::allocate(4096);          // zeroed, 64-byte aligned, writable
//   auto owner = std::make_shared<std::vector<std::byte>>(4096);  // what keeps the bytes alive
//   auto mapped = grouplin::Storage::wrap(owner->data(), owner->size(), owner);  // read-only
//   auto arena = grouplin::Storage::wrap_writable(owner->data(), owner->size(), owner);
//
// A Storage is either owned heap memory or borrowed memory (a file mapping, a NumPy array, an
// inference engine's arena) that holds a reference to whatever keeps that memory valid. Not
// thread-safe for concurrent writes to the same bytes; the counters below are atomic.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace grouplin {

inline constexpr size_t kStorageAlignment = 64;

class Storage {
 public:
  // Allocates nbytes of zeroed memory aligned to kStorageAlignment. nbytes may be 0.
  static std::shared_ptr<Storage> allocate(size_t nbytes);
  // As allocate, with the bytes left as they are (for outputs that are written whole before any
  // read: clearing them first would be a pass over memory for nothing).
  static std::shared_ptr<Storage> allocate_uninitialized(size_t nbytes);
  // The memory of large owned storages (2 MiB and more) is kept when they are freed, so that the
  // next storage of the same size reuses it instead of fresh pages, which the OS clears at first
  // touch (a layer's weight gradients, allocated every step, paid that on every call). At most
  // 4 GiB or an eighth of the machine's memory is kept. This frees all of it now and returns the
  // bytes freed.
  static size_t release_kept_memory();
  // Borrows [data, data + nbytes) read-only; `owner` is kept alive as long as this storage.
  static std::shared_ptr<Storage> wrap(const std::byte* data, size_t nbytes,
                                       std::shared_ptr<const void> owner);
  // Borrows [data, data + nbytes) for reading and writing, without a copy; `owner` (may be
  // null) is kept alive as long as this storage. The caller keeps the memory valid until then.
  static std::shared_ptr<Storage> wrap_writable(std::byte* data, size_t nbytes,
                                                std::shared_ptr<const void> owner);

  // A read-only alias of `source`'s bytes that keeps it alive and reports its generation()
  // (Tensor::read_only).
  static std::shared_ptr<Storage> read_only_alias(std::shared_ptr<Storage> source);
  // Bytes [offset, offset + nbytes) of `base`, without a copy, writable when `base` is, keeping
  // `base` alive; it knows where it lies in its root (root(), root_offset()). Throws
  // Error(OutOfBounds) for a range outside `base`.
  static std::shared_ptr<Storage> slice(std::shared_ptr<Storage> base, size_t offset,
                                        size_t nbytes);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  const std::byte* data() const { return data_; }
  // Throws Error(ReadOnlyTensor) for borrowed read-only memory. Starts a new generation().
  std::byte* mutable_data();
  size_t size() const { return size_; }
  bool writable() const { return writable_; }

  // A number, unique in the process, that changes whenever the bytes may have been written
  // through GroupLin: at creation and at every mutable_data() (so every copy_from, zero, load and
  // optimizer step). What is derived from the bytes (packed weights) is valid while it stays the
  // same. Writes it cannot see (through a pointer taken before, or memory borrowed from NumPy,
  // PyTorch or an engine) need mark_written().
  uint64_t generation() const;
  // Starts a new generation(): the bytes were written some other way.
  void mark_written();

  // The storage whose bytes these are (this one, unless made by slice() or read_only_alias()),
  // and where they start in it: what a reader keeps to know a tensor's place in its file.
  const Storage* root() const { return root_ != nullptr ? root_ : this; }
  size_t root_offset() const { return root_offset_; }

 private:
  Storage(std::byte* data, size_t size, bool owned, bool writable,
          std::shared_ptr<const void> owner);

  std::byte* data_;
  size_t size_;
  bool owned_;     // freed with the storage
  bool writable_;  // mutable_data() hands out a pointer
  std::shared_ptr<const void> owner_;
  std::atomic<uint64_t> generation_;
  Storage* alias_of_ = nullptr;    // read_only_alias: whose generation this reports
  const Storage* root_ = nullptr;  // slice, read_only_alias: the storage these bytes are of
  size_t root_offset_ = 0;
};

}  // namespace grouplin
