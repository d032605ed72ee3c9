// The per-thread buffer of the expert block (workspace.hpp).
#include "block/workspace.hpp"

#include <memory>

#include "grouplin/storage.hpp"

namespace grouplin::block {
namespace {

constexpr size_t kAlign = 64;

// The buffer is a Storage (large ones start on a huge page and are advised for them, as every
// large storage is); its tensors are views of it.
struct Buffer {
  std::shared_ptr<Storage> storage;
  bool in_use = false;
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
  if (!b.storage || b.storage->size() < bytes) {
    b.storage.reset();  // the old buffer goes before the new one is taken
    b.storage = Storage::allocate_uninitialized(bytes);
  }
  b.in_use = true;
  storage_ = b.storage;
}

Workspace::~Workspace() {
  if (storage_) t_buffer.in_use = false;
}

Tensor Workspace::take(const Shape& shape, DType dtype) {
  const size_t n = bytes_for(shape, dtype);
  if (!storage_ || used_ + n > storage_->size()) return Tensor::empty(shape, dtype);
  Tensor t = Tensor::view_of(storage_, used_, shape, dtype);
  used_ += n;
  return t;
}

}  // namespace grouplin::block
