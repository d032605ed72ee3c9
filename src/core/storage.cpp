#include "grouplin/storage.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/large_blocks.hpp"
#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"

namespace grouplin {
namespace {

using detail::kLargeBlock;
std::atomic<uint64_t> g_allocations{0};
std::atomic<uint64_t> g_allocated_bytes{0};
std::atomic<uint64_t> g_copied_bytes{0};
// Generations are drawn from one counter, so that a storage allocated where a freed one was
// never repeats its generation.
std::atomic<uint64_t> g_generation{0};

uint64_t next_generation() { return g_generation.fetch_add(1, std::memory_order_relaxed) + 1; }

// The bytes an owned storage of `nbytes` occupies: whole alignment units (at least one), and for
// large ones whole huge pages. Throws Error(SizeOverflow) where that does not fit a size_t.
size_t occupied_bytes(size_t nbytes) {
  const auto overflow = [&] {
    return Error(ErrorCode::SizeOverflow, "allocating " + std::to_string(nbytes) + " bytes");
  };
  size_t rounded = (nbytes + kStorageAlignment - 1) / kStorageAlignment * kStorageAlignment;
  if (rounded < nbytes) throw overflow();
  if (rounded == 0) rounded = kStorageAlignment;
  if (rounded >= kLargeBlock) {
    if (rounded > SIZE_MAX - kLargeBlock) throw overflow();
    rounded = (rounded + kLargeBlock - 1) / kLargeBlock * kLargeBlock;
  }
  return rounded;
}

}  // namespace

Storage::Storage(std::byte* data, size_t size, bool owned, bool writable,
                 std::shared_ptr<const void> owner)
    : data_(data),
      size_(size),
      owned_(owned),
      writable_(writable),
      owner_(std::move(owner)),
      generation_(next_generation()) {}

Storage::~Storage() {
  if (!owned_) return;
  const size_t occupied = occupied_bytes(size_);
  if (occupied >= kLargeBlock) {
    detail::give_back_large_block(data_, occupied);
  } else {
    std::free(data_);
  }
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes) {
  std::shared_ptr<Storage> s = allocate_uninitialized(nbytes);
  std::memset(s->data_, 0, s->size_);
  return s;
}

std::shared_ptr<Storage> Storage::allocate_uninitialized(size_t nbytes) {
  // aligned_alloc wants a size that is a multiple of the alignment, and never 0. Large storages
  // (expert weights, their gradients) take whole huge pages on a 2 MiB boundary, advised for
  // transparent huge pages (streaming the weights of many experts then does not walk the page
  // tables every 4 KiB), and their memory is kept for the next storage of that size when they
  // are freed (core/large_blocks.hpp).
  const size_t rounded = occupied_bytes(nbytes);
  void* p = rounded >= kLargeBlock ? detail::take_large_block(rounded)
                                   : std::aligned_alloc(kStorageAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  // The padding past nbytes is zeroed either way: it is never anyone's output.
  std::memset(static_cast<std::byte*>(p) + nbytes, 0, rounded - nbytes);
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  g_allocated_bytes.fetch_add(nbytes, std::memory_order_relaxed);
  return std::shared_ptr<Storage>(
      new Storage(static_cast<std::byte*>(p), nbytes, true, true, nullptr));
}

size_t Storage::release_kept_memory() { return detail::release_large_blocks(); }

std::shared_ptr<Storage> Storage::wrap(const std::byte* data, size_t nbytes,
                                       std::shared_ptr<const void> owner) {
  // The const_cast is safe: mutable_data() refuses to hand out a pointer for borrowed memory.
  return std::shared_ptr<Storage>(
      new Storage(const_cast<std::byte*>(data), nbytes, false, false, std::move(owner)));
}

std::shared_ptr<Storage> Storage::wrap_writable(std::byte* data, size_t nbytes,
                                                std::shared_ptr<const void> owner) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, false, true, std::move(owner)));
}

std::shared_ptr<Storage> Storage::read_only_alias(std::shared_ptr<Storage> source) {
  Storage* of = source->alias_of_ != nullptr ? source->alias_of_ : source.get();
  const std::byte* data = source->data();
  const size_t size = source->size();
  const Storage* root = source->root();
  const size_t root_offset = source->root_offset();
  std::shared_ptr<Storage> alias = wrap(data, size, std::move(source));
  alias->alias_of_ = of;
  alias->root_ = root;
  alias->root_offset_ = root_offset;
  return alias;
}

std::shared_ptr<Storage> Storage::slice(std::shared_ptr<Storage> base, size_t offset,
                                        size_t nbytes) {
  if (offset > base->size() || nbytes > base->size() - offset) {
    throw Error(ErrorCode::OutOfBounds, "slice of bytes [" + std::to_string(offset) + ", +" +
                                            std::to_string(nbytes) + ") of a storage of " +
                                            std::to_string(base->size()) + " bytes");
  }
  const Storage* root = base->root();
  const size_t root_offset = base->root_offset() + offset;
  std::byte* data = base->data_ + offset;
  const bool writable = base->writable();
  std::shared_ptr<Storage> s(new Storage(data, nbytes, false, writable, std::move(base)));
  s->root_ = root;
  s->root_offset_ = root_offset;
  return s;
}

std::byte* Storage::mutable_data() {
  if (!writable_) {
    throw Error(
        ErrorCode::ReadOnlyTensor,
        "writing to read-only storage of " + std::to_string(size_) +
            " bytes (borrowed read-only memory: a file mapping or a const buffer); copy it first");
  }
  mark_written();
  return data_;
}

uint64_t Storage::generation() const {
  const Storage* s = alias_of_ != nullptr ? alias_of_ : this;
  return s->generation_.load(std::memory_order_acquire);
}

void Storage::mark_written() {
  Storage* s = alias_of_ != nullptr ? alias_of_ : this;
  s->generation_.store(next_generation(), std::memory_order_release);
}

namespace detail {

StorageStats storage_stats() {
  StorageStats s;
  s.allocations = g_allocations.load(std::memory_order_relaxed);
  s.allocated_bytes = g_allocated_bytes.load(std::memory_order_relaxed);
  s.copied_bytes = g_copied_bytes.load(std::memory_order_relaxed);
  return s;
}

void count_copied_bytes(uint64_t n) { g_copied_bytes.fetch_add(n, std::memory_order_relaxed); }

}  // namespace detail

}  // namespace grouplin
