// The per-thread buffer of the expert block (workspace.hpp).
#include "block/workspace.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace grouplin::block {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

struct Buffer {
  std::byte* data = nullptr;
  size_t size = 0;
  bool in_use = false;
  ~Buffer() { std::free(data); }
};

thread_local Buffer t_buffer;

}  // namespace

size_t Workspace::bytes_for(const Shape& shape, DType dtype) {
  const size_t n = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return (n + kAlign - 1) / kAlign * kAlign;
}

Workspace::Workspace(size_t bytes) {
  Buffer& b = t_buffer;
  if (b.in_use) return;
  if (b.size < bytes) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, rounded);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);
    std::free(b.data);
    b.data = static_cast<std::byte*>(p);
    b.size = rounded;
  }
  b.in_use = true;
  base_ = b.data;
  size_ = b.size;
}

Workspace::~Workspace() {
  if (base_ != nullptr) t_buffer.in_use = false;
}

Tensor Workspace::take(const Shape& shape, DType dtype) {
  const size_t n = bytes_for(shape, dtype);
  if (base_ == nullptr || used_ + n > size_) return Tensor::empty(shape, dtype);
  std::byte* p = base_ + used_;
  used_ += n;
  return Tensor::from_blob(static_cast<void*>(p), shape, dtype);
}

}  // namespace grouplin::block
